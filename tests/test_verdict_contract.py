"""`reprobox verdict` under a real `git bisect run`: a typo, a read-only results folder and an
unreachable Slurm exit 255, so git aborts and names no commit (2, 70 and 4 read as "bad" and
named one). Real git over the flagpkg history (tests/gitrepo_fixture.py), the real CLI, a
read-only tmpfs, a slurm.conf whose controller does not listen; plus the one rule's cases."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitrepo_fixture import PACKAGE, FlagRepo

from conftest import FIXTURES, reprobox
from reprobox.cli import main as cli_main
from reprobox.cli import verdict
from reprobox.core.errors import ExitCode


@pytest.mark.parametrize(
    ("code", "answer"),
    [(0, 0), (1, 1), (125, 125), (3, 125), (2, 255), (4, 255), (5, 255), (6, 255), (70, 255),
     (124, 255), (130, 255), (143, 255), (129, 255), (None, 0), (7, 255)],
)  # fmt: skip
def test_verdict_answers_only_in_git_bisect_run_codes(code: int | None, answer: int) -> None:
    assert verdict.bisect_code(code) == answer


def test_the_command_is_known_before_parsing() -> None:
    assert verdict.is_verdict(["verdict", "toy", "--variant", "x"])
    assert verdict.is_verdict(["--version", "verdict"])  # whatever argparse then says
    assert not verdict.is_verdict(["run", "verdict"]) and not verdict.is_verdict([])


def test_an_uncaught_exception_in_verdict_is_255_and_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(argv: object) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli_main, "_main", broken)
    assert cli_main.main(["verdict", "toy"]) == verdict.STOP
    err = capsys.readouterr().err
    assert err.strip() == "reprobox: error: internal error: RuntimeError: boom (please report it)"


def test_argparse_errors_of_verdict_are_255_and_of_run_stay_2(scratch_root: Path) -> None:
    bad_flag = reprobox("verdict", "toy", "--platform", "tpu")
    assert bad_flag.returncode == 255 and "invalid choice" in bad_flag.stderr.splitlines()[-1]
    unknown = reprobox("verdict", "toy", "--bogus")
    assert unknown.returncode == 255 and "--bogus" in unknown.stderr.splitlines()[-1]
    assert "Traceback" not in bad_flag.stderr + unknown.stderr
    assert reprobox("run", "toy", "--platform", "tpu").returncode == ExitCode.BAD_INPUT


# ---- a real `git bisect run` -------------------------------------------------------------------


@pytest.fixture
def flag_root(scratch_root: Path) -> Path:
    shutil.copytree(FIXTURES / "repros" / "flagpkg", scratch_root / "repros" / "flagpkg")
    return scratch_root


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _bisect_run(flagrepo: FlagRepo, where: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`git bisect run reprobox verdict flagpkg --with-editable ...` in a clone, from the
    release (bad) back to the initial commit (good)."""
    checkout = where / "checkout-flagpkg"
    subprocess.run(["git", "clone", "-q", str(flagrepo.path), str(checkout)], check=True)
    shas = flagrepo.shas
    assert _git(checkout, "bisect", "start", shas["release"], shas["initial"]).returncode == 0
    return _git(
        checkout, "bisect", "run", sys.executable, "-m", "reprobox", "verdict", "flagpkg",
        "--with-editable", f"{PACKAGE}={checkout}", *flags,
    )  # fmt: skip


def _assert_aborted(done: subprocess.CompletedProcess[str], line: str) -> None:
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "is the first bad commit" not in said, said
    assert "exit code 255" in said, said  # git: "bisect run failed: exit code 255 from ..."
    assert line in said and "Traceback" not in said, said


@pytest.mark.e2e
def test_a_typo_aborts_git_bisect_run(flagrepo: FlagRepo, flag_root: Path) -> None:
    done = _bisect_run(flagrepo, flag_root, "--variant", "brokn")
    _assert_aborted(done, "reprobox: error: repro 'flagpkg' has no variant 'brokn'")
    done = _bisect_run(flagrepo, flag_root / "2", "--timeout", "-1")
    _assert_aborted(done, "reprobox: error: --timeout: -1.0 is not a timeout")


@pytest.fixture
def read_only_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A results folder nobody can write, root included: a read-only tmpfs."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (CI runs as root)")
    folder = tmp_path / "ro-results"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
    monkeypatch.setenv("REPROBOX_RESULTS", str(folder))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.e2e
def test_a_read_only_results_folder_aborts_git_bisect_run(
    flagrepo: FlagRepo, flag_root: Path, read_only_results: Path
) -> None:
    done = _bisect_run(flagrepo, flag_root, "--variant", "broken")
    _assert_aborted(done, "Read-only file system")


@pytest.mark.e2e
def test_an_unreachable_slurm_aborts_git_bisect_run(
    flagrepo: FlagRepo, flag_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("scontrol") is None:
        pytest.fail("no scontrol on PATH (scripts/setup-system.sh installs slurm-client)")
    conf = flag_root / "slurm.conf"  # a controller on a port nothing listens on
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/munge\n"
        "MessageTimeout=2\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
        "PartitionName=debug Nodes=localhost Default=YES\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    done = _bisect_run(flagrepo, flag_root, "--variant", "broken", "--backend", "slurm")
    _assert_aborted(done, "reprobox: error: cannot list the partitions")
