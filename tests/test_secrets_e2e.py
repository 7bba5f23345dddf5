"""Nothing secret leaves, through the real CLI on a toy repro: tokens of every shape planted
in the environment, in a script's output and result, and in a repro file, then every output
grepped (terminal lines, records, logs, results, comment, report.html, bundle, export)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from conftest import reprobox
from fakes import repro_toml

pytestmark = pytest.mark.e2e

# Split so that no scanner of this file (and no scrubber of it) sees a whole token.
PLANTED = {
    "hf": "hf_" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5",
    "ghp": "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3",
    "pat": "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop",
    "sk": "sk-" + "proj-Abcdefghijklmnopqrstuvwx0123",
    "aws": "AKIA" + "QRSTUVWXYZ234567",
    "slack": "xoxb-" + "1234567890-abcdefghij",
    "jwt": "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig-4567",
    "env": "plain-env-secret-7731",  # only the environment says it is a secret
    "url": "urlpass" + "9911",  # https://bob:urlpass9911@host
    "password": "hunter" + "2secret",  # `password hunter2secret`
    "mysql": "S3cret" + "Mysql9",  # mysql -u root -pS3cretMysql9
    "git": "gitpass" + "5511",  # --with torch@git+https://bob:gitpass5511@...
}

TOML = repro_toml(
    title="a script that prints every secret it can find",
    upstream="https://example.invalid/leaky",
    script="leaky.py",
    processes=2,
    launch_extra='pass_env = ["LEAKY_API_TOKEN"]\n',  # as a real repro asks for HF_TOKEN
    pins=["torch==2.13.0", "numpy<2"],
    variants={"broken": "reproduced"},
    variant_extra={"broken": 'args = ["--mode", "broken"]\n'},
)

HELPER = f"""\
# A repro file holding secrets, as a careless repro might.
HF = {PLANTED["hf"]!r}
GHP = {PLANTED["ghp"]!r}
PAT = {PLANTED["pat"]!r}
SK = {PLANTED["sk"]!r}
AWS = {PLANTED["aws"]!r}
SLACK = {PLANTED["slack"]!r}
JWT = {PLANTED["jwt"]!r}
DSN = "https://bob:{PLANTED["url"]}@db.example.invalid/x"
NOTE = "login bob password {PLANTED["password"]}"
DUMP = "mysql -u root -p{PLANTED["mysql"]} shop"
"""

SCRIPT = """\
import json
import os
import sys

import helper

said = [helper.HF, helper.GHP, helper.PAT, helper.SK, helper.AWS, helper.SLACK, helper.JWT,
        helper.DSN, helper.NOTE, helper.DUMP, "env " + os.environ["LEAKY_API_TOKEN"]]
rank = int(os.environ.get("RANK", "0"))
for line in said:
    print(f"rank {rank}: {line}", flush=True)
    print(f"rank {rank} err: {line}", file=sys.stderr, flush=True)
if rank == 0:
    result = {"schema": 1, "variant": "broken", "verdict": "reproduced",
              "reason": "leaked " + " ".join(said), "metrics": {"level": 1.0},
              "versions": {"note": helper.NOTE}, "said": said}
    with open(os.environ["REPRO_RESULT"], "w") as handle:
        json.dump(result, handle)
sys.exit(1)
"""


def _leaks(text: str) -> list[str]:
    return [name for name, value in PLANTED.items() if value in text]


def _files_leaking(top: Path) -> dict[str, list[str]]:
    found = {}
    for path in sorted(top.rglob("*")):
        if path.is_file() and not path.is_symlink():
            names = _leaks(path.read_bytes().decode(errors="replace")) + _leaks(path.name)
            if names:
                found[str(path.relative_to(top))] = names
        if any(value in path.name for value in PLANTED.values()):
            found.setdefault(str(path.relative_to(top)), []).append("in its name")
    return found


def test_no_planted_secret_leaves_through_any_output(
    scratch_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repro = scratch_root / "repros" / "leaky"
    repro.mkdir()
    (repro / "repro.toml").write_text(TOML)
    (repro / "leaky.py").write_text(SCRIPT)
    (repro / "helper.py").write_text(HELPER)
    monkeypatch.setenv("LEAKY_API_TOKEN", PLANTED["env"])
    results = scratch_root / "results"
    said: dict[str, str] = {}

    done = reprobox("run", "leaky")
    said["run"] = done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    git = f"git+https://bob:{PLANTED['git']}@127.0.0.1:9/nothing.git@main"
    failed = reprobox("run", "leaky", f"--with=torch@{git}")
    said["run --with git"] = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert "[REDACTED]" in failed.stderr, failed.stderr
    echoed = reprobox("run", "leaky", "--echo")  # the launcher's output streamed live
    said["run --echo"] = echoed.stdout + echoed.stderr
    assert echoed.returncode == 0 and "[REDACTED]" in said["run --echo"], said["run --echo"]
    for command in (
        ["table", "leaky"],
        ["report", "leaky", "--no-env"],
        ["bundle", "leaky", "-o", str(tmp_path / "bundle")],
        ["export", "leaky", "-o", str(tmp_path / "export")],
    ):
        out = reprobox(*command)
        said[command[0]] = out.stdout + out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        # the table says the --with cell ended in error (its exit code); the rest must succeed
        assert out.returncode == 0 or command[0] == "table", (command, out.stderr)
    assert "secrets replaced with [REDACTED] in helper.py" in said["bundle"], said["bundle"]
    archive = tmp_path / "bundle" / "leaky-bundle.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "untarred", filter="data")

    record = next(results.glob("leaky/cpu-broken/*/record.json"))
    assert record.parent.joinpath("rank1.log").is_file()  # the logs were kept, scrubbed
    assert (results / "leaky" / "_report" / "report.html").is_file()
    assert (tmp_path / "untarred" / "leaky-bundle" / "helper.py").is_file()
    leaks = {name: _leaks(text) for name, text in said.items() if _leaks(text)}
    for top in (results, tmp_path / "bundle", tmp_path / "untarred", tmp_path / "export"):
        leaks |= {f"{top.name}/{k}": v for k, v in _files_leaking(top).items()}
    assert not leaks, leaks
