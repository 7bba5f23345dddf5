"""No secret reaches a report: planted in the environment, in a recorded command, in a log, in
a result, in collect_env's output; home directories become `~`."""

from __future__ import annotations

import json
import re
import stat
import time
from pathlib import Path

import pytest
from test_report import fake_repro, save_record

from reprobox.core.scrub import REDACTED, Scrubber, looks_secret
from reprobox.report import build as report

HF = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
GHP = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
SK = "sk-" + "proj-Abcdefghijklmnopqrstuvwx0123"
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"
ENV_SECRET = "plain-env-secret-7731"
FLAG_SECRET = "flag-secret-value-4242"
URL_PASSWORD = "urlpass9911"
BEARER = "eyJhbGciOiJIUzI1NiJ9.payload.sig123"
USER = "alice"


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
             "PYPI_PASS", "MY_CREDENTIALS", "GH_AUTH", "SSH_PRIVATE_KEY"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert looks_secret(name)


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "MAX_NEW_TOKENS", "PATH", "HOME", "PWD", "KEYBOARD",
             "PASSTHROUGH", "AUTHOR", "MONKEY"],
)  # fmt: skip
def test_harmless_names(name: str) -> None:
    assert not looks_secret(name)


def results_dir(root: Path) -> Path:
    """The results folder of a scratch checkout (conftest points REPROBOX_RESULTS there)."""
    return root / "results"


def test_scrubber_shapes_and_paths() -> None:
    scrub = Scrubber({"HF_TOKEN": HF, "MY_PASS": "hunter22", "TOKENIZERS_PARALLELISM": "false"},
                     home=f"/home/{USER}")  # fmt: skip
    text = scrub.text(
        f"token {HF} and {GHP} {PAT} {SK} {AWS}; curl -H 'Authorization: Bearer {BEARER}' "
        f"https://bob:{URL_PASSWORD}@example.invalid/x.git password=hunter22 "
        f"/home/{USER}/proj /root/.cache /home/bob/x /opt/root/keep "
        "TOKENIZERS_PARALLELISM=false max_new_tokens=20 the token embeddings"
    )
    for secret in (HF, GHP, PAT, SK, AWS, BEARER, URL_PASSWORD, "hunter22", USER, "/root/.cache"):
        assert secret not in text
    assert "~/proj ~/.cache ~/x /opt/root/keep" in text
    # what is not secret stays readable, code included
    assert "TOKENIZERS_PARALLELISM=false max_new_tokens=20 the token embeddings" in text
    code = (
        "tokenizer.pad_token = tokenizer.eos_token\n"
        "key = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]\n"
        "kwargs = dict(pad_token_id=tokenizer.eos_token_id, use_auth_token=True)\n"
        "api_key = os.environ['WANDB_API_KEY']\n"
    )
    assert scrub.text(code) == code
    assert scrub.argv(["run", "--hf-token", "plainvalue", "--model", "gpt2"]) == [
        "run", "--hf-token", REDACTED, "--model", "gpt2",
    ]  # fmt: skip


def test_no_planted_secret_survives_a_report(
    scratch_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", ENV_SECRET)
    monkeypatch.setenv("HF_TOKEN", HF)
    home = scratch_root.parent / "home" / USER
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    fake_repro(scratch_root)
    # an interpreter beside the recorded launcher whose collect_env output leaks too
    bin_dir = home / "envs" / "abc" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\necho "PyTorch version: 2.13.0 token={GHP} at {home}/x"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    command = [
        str(bin_dir / "accelerate"),
        "launch",
        "--hf_token",
        FLAG_SECRET,
        f"--hub-url=https://user:{URL_PASSWORD}@hub.example.invalid",
        str(scratch_root / "repros" / "ppo" / "ppo.py"),
        "--variant",
        "broken",
        "--api-key",
        SK,
    ]
    broken = save_record(
        scratch_root,
        "broken",
        "reproduced",
        kl=0.1,
        command=command,
        reason=f"loaded with {ENV_SECRET}",
        series={f"kl_rank0_{AWS}": [0.1, 0.2]},
    )
    failed = save_record(
        scratch_root, "fixed", None, command=command, reason=f"crash; Bearer {BEARER}"
    )
    (Path(failed.dir) / "launch.log").write_text(
        f"Traceback at /root/.cache/x.py and /home/{USER}/y.py\n"
        f"requests: Authorization: Bearer {BEARER}\nHF_TOKEN={HF}\n{PAT}\n"
    )
    assert broken.dir
    made = report.write_report(scratch_root, "ppo")

    planted = [HF, GHP, PAT, SK, AWS, ENV_SECRET, FLAG_SECRET, URL_PASSWORD, BEARER, str(home)]
    written = [p for p in made.dir.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"report.md", "comment.md", "results.json"}
    for path in written:
        data = path.read_bytes()
        for secret in planted:
            assert secret.encode() not in data, f"{secret} leaked into {path.name}"
    md = made.markdown.read_text()
    assert "/root/" not in md and f"/home/{USER}" not in md
    assert REDACTED in md and "~/" in md
    assert "PyTorch version: 2.13.0" in md  # collect_env ran, scrubbed, and is there
    # the records on disk are the harness's, untouched by scrubbing
    assert FLAG_SECRET in (Path(broken.dir) / "record.json").read_text()
    assert results_dir(scratch_root).is_dir()


PYPI = "pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMAACKlsz"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
SLACK = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
SAS_SIG = "lU8fWCcMrkdO5wJf%2FqT3Z0Yy8%2BpzIqoG0xJ5oYkQ0Hs%3D"


@pytest.mark.parametrize(
    ("planted", "secret", "kept"),
    [
        (f"twine upload -p {PYPI} dist/*", PYPI, "twine upload"),
        (f"TWINE_PASSWORD: {PYPI}", PYPI, "TWINE_PASSWORD"),
        (f"got token {JWT} from the server", JWT, "from the server"),
        (f"posting to {SLACK} failed", "XXXXXXXXXXXXXXXXXXXXXXXX", "failed"),
        (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={AZURE_KEY};"
         "EndpointSuffix=core.windows.net", AZURE_KEY[:40], "AccountName=acct"),
        (f"https://acct.blob.core.windows.net/c/f?sv=2022-11-02&sp=r&sig={SAS_SIG}",
         SAS_SIG, "sv=2022-11-02"),
        ("machine pypi.example.invalid login alice password hunter", "hunter", "machine"),
        ("machine h.invalid\n  login alice\n  password correcthorse\n", "correcthorse", "alice"),
        ("default login bob password s3cr3tpw", "s3cr3tpw", "default"),
        ("curl -fsSL -u alice:Tr0ub4dor https://x.invalid/f", "Tr0ub4dor", "alice:"),
        ("curl --user=alice:plainpass https://x.invalid/f", "plainpass", "--user=alice:"),
        ("sshpass -p hunter2 ssh host.invalid", "hunter2", "ssh host.invalid"),
        ("sshpass -e -pSeCrEt ssh host.invalid", "SeCrEt", "ssh host.invalid"),
        ('{"user": "alice", "password": "correct horse battery staple"}',
         "correct horse battery staple", '"user": "alice"'),
        ("{'db_password': 'two words'}", "two words", "db_password"),
        ('{"api_key": "abc def 123456"}', "abc def 123456", "api_key"),
    ],
)  # fmt: skip
def test_more_secret_shapes_are_scrubbed(planted: str, secret: str, kept: str) -> None:
    text = Scrubber({}, home="/home/nobody").text(planted)
    assert secret not in text, text
    assert REDACTED in text and kept in text, text


@pytest.mark.parametrize(
    "harmless",
    [
        '{"pad_token": "<|endoftext|>", "eos_token": "</s>"}',
        "podman run -u 10001:10001 image",
        "python -u script.py --user alice",
        "the login failed",
        "pypi-simple is a package name",
        "docs at https://hooks.example.invalid/services/x",
    ],
)
def test_what_only_looks_like_the_new_shapes_stays(harmless: str) -> None:
    assert Scrubber({}, home="/home/nobody").text(harmless) == harmless


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("login bob password hunter2secret", "login bob password [REDACTED]"),
        ("the db password hunter2secret is old", "the db password [REDACTED] is old"),
        ("mysql -u root -pS3cretMysql9 shop", "mysql -u root -p[REDACTED] shop"),
        ("password is required", "password is required"),
        ("ssh -p22 host; mkdir -pv out; docker run -p8080:80 x", None),
        ("deploy -pS3cret!x9 now", "deploy -p[REDACTED] now"),
        # code in a repro's script is never a credential: redacting it breaks the script
        ('"signed_kl_negative_mean": -pooled["mean"],', None),
        ("x = -pooled.mean() + -pairs[i]", None),
        ("y = -p_value_2 * 2 - -pooled.mean", None),
    ],
)
def test_password_words_and_glued_dash_p(text: str, kept: str | None) -> None:
    assert Scrubber({}).text(text) == (kept or text)


def test_a_git_source_shows_no_credentials_in_label_slug_or_identity() -> None:
    from reprobox.core.cells import Cell

    url = "git+https://bob:gitpass5511@example.com/x.git@main"
    cell = Cell("toy", "broken", packages=(("torch", url),))
    shown = [cell.label, cell.slug, json.dumps(cell.identity())]
    assert not [s for s in shown if "gitpass5511" in s], shown
    assert "[REDACTED]" in cell.label
    assert f"--with=torch@{url}" in cell.run_args()  # what runs it still reaches the repo


def _cases() -> list[str]:
    """Every text this file's parametrized cases scrub."""
    texts: list[str] = []
    tests = (test_more_secret_shapes_are_scrubbed, test_what_only_looks_like_the_new_shapes_stays,
             test_password_words_and_glued_dash_p)  # fmt: skip
    for test in tests:
        for mark in test.pytestmark:  # type: ignore[attr-defined]
            for values in mark.args[1]:
                row = values if isinstance(values, tuple) else (values,)
                texts.extend(v for v in row if isinstance(v, str))
    return [
        *texts,
        f"curl -H 'Authorization: Bearer {BEARER}' https://bob:{URL_PASSWORD}@x.invalid/ "
        "password=hunter22 --hf-token=abc123def /home/alice/x /Users/bob/y /root/z "
        "--db-password s3cr3t-x9 'secret_key': 'a1b2c3d4'",
    ]


def test_each_shape_is_skipped_only_where_it_cannot_match() -> None:
    """A pass of a shape is skipped when the text lacks all its needles (`NEEDLES`): every
    match of every case holds one, or the skip would let a secret through."""
    from reprobox.core.scrub import NEEDLES

    texts = _cases()
    assert len(texts) > 30
    for shape, needles in NEEDLES.items():
        for text in texts:
            for match in shape.finditer(text):
                seen = match.group(0)
                seen = seen.lower() if shape.flags & re.IGNORECASE else seen
                assert any(needle in seen for needle in needles), (shape.pattern, seen)


def test_a_secret_spelled_with_unicode_case_is_still_found() -> None:
    """`(?i)` pairs `ſ` with `s` and `İ` with `i`, which lowering the text does not: a text
    that is not ASCII always gets the pass."""
    text = Scrubber({}).text("PAſSWORD hunter22secret\nAuthorİzation: Bearer abcdefgh12345")
    assert "hunter22secret" not in text and "abcdefgh12345" not in text, text


@pytest.mark.parametrize(
    "line",
    [
        "a" * 256 * 1024,
        "-a" * 128 * 1024,
        "a." * 128 * 1024,
        "0f" * 128 * 1024,
        "x1=" * 87381,
        "mysql " * 43690,
        "-----BEGIN RSA PRIVATE KEY----- " * 8192,
    ],
)
def test_a_long_unbroken_line_scrubs_in_linear_time(line: str) -> None:
    """A backtracking pattern tried at each character of a word took 2.3 s for 8 KiB and 4x
    per doubling (about 40 min for 256 KiB); linear, it is milliseconds (the figures:
    `nox -s bench -- scrub`). So for a line of mysql words with no -p (78 s for 120 KB) and
    of key BEGINs with no END (14 s for 160 KB). The bound is loose: the machine is shared."""
    started = time.perf_counter()
    Scrubber({"HF_TOKEN": HF}).text(line + " HF_TOKEN=" + HF)
    assert time.perf_counter() - started < 10


def test_a_private_key_block_is_replaced_whole_and_mysql_p_after_its_word() -> None:
    body = "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2ByS7XxPcz\nq9Ia0TMfH0c4VI+OsX6Iu\n"
    key = f"-----BEGIN RSA PRIVATE KEY-----\n{body}-----END RSA PRIVATE KEY-----"
    text = Scrubber({}).text(f"id_rsa:\n{key}\nthen -----BEGIN PRIVATE KEY----- alone\n")
    assert text == "id_rsa:\n[REDACTED]\nthen -----BEGIN PRIVATE KEY----- alone\n", text
    lines = "mysql mysql -h db -u root\nmysqldump -u root -pS3cretMysql9 shop -pOther1x\n"
    assert Scrubber({}).text(lines) == (
        "mysql mysql -h db -u root\nmysqldump -u root -p[REDACTED] shop -pOther1x\n"
    )
