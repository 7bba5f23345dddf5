"""A bundle under a real `git bisect run`: `./run.sh VARIANT` exits 3 when the environment
does not install, which git reads as "bad" and names that commit; `./run.sh verdict VARIANT`
answers by `reprobox verdict`'s rule (0/1/125, 255 else), so the commit is skipped and git
says the answer is one of two commits instead of naming the broken one."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_bundle import _bare_env

from conftest import reprobox
from reprobox.core.bisect_codes import bisect_code
from reprobox.report.bundle_run import RUN_SH_CODES, SUMS_FILE, verdict_case_lines


def test_run_sh_verdict_maps_each_status_by_the_verdict_rule() -> None:
    lines = verdict_case_lines().splitlines()
    assert [line.split(")")[0].strip() for line in lines] == [str(int(c)) for c in RUN_SH_CODES]
    for line, code in zip(lines, RUN_SH_CODES, strict=True):
        assert line.endswith(f"exit {bisect_code(code)} ;;"), line
    assert bisect_code(3) == 125 and bisect_code(2) == bisect_code(4) == 255


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cwd)}  # fmt: skip
    return subprocess.run(["git", "-c", "init.defaultBranch=main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def _commit(repo: Path, message: str) -> str:
    assert _git(repo, "add", "-A").returncode == 0
    assert _git(repo, "commit", "-q", "-m", message).returncode == 0
    return _git(repo, "rev-parse", "HEAD").stdout.strip()


def _history(bundle: Path, repo: Path) -> list[str]:
    """good, good, environment broken (a pin no index has: exit 3), bad. The broken commit
    is a regenerated bundle (its SHA256SUMS agrees with its lock), as a real history's
    would be: a lock that differs from its sums, or a download that does not match its
    hash, is an integrity error (exit 6, 255 under git bisect), never a skip."""
    shutil.copytree(bundle, repo)
    (repo / ".gitignore").write_text(".venv-*/\nlogs/\nresult-*.json\n")
    assert _git(repo, "init", "-q").returncode == 0
    shas = [_commit(repo, "the bundle, clean")]
    (repo / "NOTES.md").write_text("a change that changes nothing\n")
    shas.append(_commit(repo, "notes"))
    run_sh, req = repo / "run.sh", repo / "requirements" / "clean.txt"
    good_sh, good_req = run_sh.read_text(), req.read_text()
    env_id = re.search(r"clean\) echo ([0-9a-f]{10}) ;;", good_sh)
    assert env_id is not None
    run_sh.write_text(good_sh.replace(env_id[1], "0" * 10))  # a new environment for the lock
    sums = repo / SUMS_FILE
    good_sums = sums.read_text()
    broken = good_req + f"packaging==0.0.0.post999 --hash=sha256:{'0' * 64}\n"
    req.write_text(broken)
    sums.write_text(good_sums.replace(_sha256(good_req), _sha256(broken)))
    assert _sha256(broken) in sums.read_text()
    shas.append(_commit(repo, "a lock that does not install"))
    req.write_text(good_req)
    sums.write_text(good_sums)
    run_sh.write_text(good_sh.replace("--mode clean", "--mode reproduced"))
    shas.append(_commit(repo, "the bug"))
    return shas


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _bisect(repo: Path, shas: list[str], env: dict[str, str], *run: str) -> str:
    assert _git(repo, "bisect", "start", shas[-1], shas[0]).returncode == 0
    done = subprocess.run(["git", "bisect", "run", *run], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=1500)  # fmt: skip
    _git(repo, "bisect", "reset")
    return done.stdout + done.stderr


@pytest.mark.e2e
def test_git_bisect_run_skips_a_commit_whose_environment_fails(
    toy_root: Path, tmp_path: Path
) -> None:
    made = reprobox("bundle", "toy", "--variant", "clean", "-o", str(tmp_path / "out"))
    assert made.returncode == 0, made.stderr
    repo = tmp_path / "history"
    shas = _history(tmp_path / "out" / "toy-bundle", repo)
    env = {**_bare_env(tmp_path, with_uv=True), "GIT_AUTHOR_NAME": "t",
           "GIT_COMMITTER_NAME": "t", "EMAIL": "t@example.invalid"}  # fmt: skip

    # the plain form: exit 3 reads as "bad", and git names the broken commit
    plain = _bisect(repo, shas, env, "sh", "run.sh", "clean")
    assert f"{shas[2]} is the first bad commit" in plain, plain

    # the verdict form: the broken commit is skipped, the answer is "one of" the two
    told = _bisect(repo, shas, env, "sh", "run.sh", "verdict", "clean")
    assert "is the first bad commit" not in told, told
    assert "run.sh: the system lacks what the bundle needs, or its environment did not " \
           "install: skip (exit 125)" in told  # fmt: skip
    after = told.partition("could be any of:")[2]
    assert shas[2] in after and shas[3] in after, told
    # and the good commit it did run answered 0 through the same mapping
    assert "clean: level = " in told, told
