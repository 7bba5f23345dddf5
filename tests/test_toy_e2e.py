"""Every way a run can end, through the real CLI, over a real 2-rank torch.distributed toy.

Each failure must end with one plain line on stderr, a known exit code, nothing left running,
and the records already measured kept on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import reprobox
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e


def _records(root: Path, variant: str) -> list[dict]:
    paths = sorted((root / "results" / "toy" / f"cpu-{variant}").glob("*/record.json"))
    return [json.loads(p.read_text()) for p in paths]


def _one_error_line(stderr: str, *fragments: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("reprobox: error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def _leftovers(root: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if str(root) in cmdline and proc.pid != os.getpid():
            found.append(cmdline)
    return found


def test_default_variants_match(toy_root: Path) -> None:
    done = reprobox("run", "toy")
    assert done.returncode == ExitCode.OK, done.stderr
    assert [r["status"] for r in _records(toy_root, "clean")] == ["match"]
    record = _records(toy_root, "reproduced")[0]
    assert record["verdict"] == "reproduced" and record["metrics"] == {"level": 1.0}
    assert (Path(record["dir"]) / "rank1.log").is_file()
    table = reprobox("table", "toy", "--default")  # the newest verdicts, from disk
    assert table.returncode == ExitCode.OK, table.stderr
    assert "reproduced" in table.stdout and "level=1" in table.stdout


def test_a_verdict_that_misses_its_expectation_fails(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "wrong")
    assert done.returncode == ExitCode.FAILED
    assert "MISMATCH" in done.stderr


def test_verdict_command_speaks_git_bisect(toy_root: Path) -> None:
    assert reprobox("verdict", "toy", "--variant", "clean").returncode == 0
    assert reprobox("verdict", "toy", "--variant", "reproduced").returncode == 1
    assert reprobox("verdict", "toy", "--variant", "cannot").returncode == 125


def test_cannot_test_is_accepted_where_declared(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "cannot")
    assert done.returncode == ExitCode.OK, done.stderr
    assert _records(toy_root, "cannot")[0]["verdict"] == "cannot_test"


def test_a_preflight_can_end_a_cell_before_launch(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "early", "--variant", "preflight_ok")
    assert done.returncode == ExitCode.OK, done.stderr
    early = _records(toy_root, "early")[0]
    assert early["verdict"] == "cannot_test" and early["reason"] == "toy: this host cannot run it"
    assert not (Path(early["dir"]) / "launch.log").exists()  # never launched
    launched = _records(toy_root, "preflight_ok")[0]
    assert launched["verdict"] == "clean" and (Path(launched["dir"]) / "rank1.log").is_file()


def test_matrix_cells_run_with_their_expectations(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--matrix")
    assert done.returncode == ExitCode.OK, done.stderr
    assert len(list((toy_root / "results" / "toy").glob("*@level=*"))) == 4


@pytest.mark.parametrize("variant", ["crash", "crash_torchrun"])
def test_a_crashing_rank_is_an_error_with_its_reason(toy_root: Path, variant: str) -> None:
    done = reprobox("run", "toy", "--variant", variant)
    assert done.returncode == ExitCode.RUN_FAILED
    _one_error_line(done.stderr, "no result written", "RuntimeError: boom on rank 1")
    assert _leftovers(toy_root) == []


@pytest.mark.parametrize(("variant", "limit"), [("hang", 8), ("hang_torchrun", 10)])
def test_a_hung_collective_times_out(toy_root: Path, variant: str, limit: int) -> None:
    started = time.monotonic()
    done = reprobox("run", "toy", "--variant", variant)
    assert done.returncode == ExitCode.TIMEOUT
    assert time.monotonic() - started < limit + 40
    _one_error_line(done.stderr, f"timed out after {limit}s")
    assert _records(toy_root, variant)[0]["status"] == "error"
    assert _leftovers(toy_root) == []


def test_orphans_that_left_the_process_group_are_killed(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "orphan")
    assert done.returncode == ExitCode.TIMEOUT
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "300"]
                and "REPROBOX_RUN_ID" in _environ(p)]  # fmt: skip


def _environ(proc: psutil.Process) -> dict:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


@pytest.mark.parametrize(
    ("variant", "message"),
    [("lie", "script says clean but its metrics say reproduced"),
     ("garbage", "not valid JSON (half-written?)")],
)  # fmt: skip
def test_results_the_numbers_do_not_support_are_errors(
    toy_root: Path, variant: str, message: str
) -> None:
    done = reprobox("run", "toy", "--variant", variant)
    assert done.returncode == ExitCode.RUN_FAILED
    _one_error_line(done.stderr, message)


def test_ctrl_c_keeps_what_was_measured_and_leaves_nothing(toy_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "toy", "--variant", "clean", "--variant",
         "hang", "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    # a record is saved as a cell launches: wait for clean's verdict and hang's launch
    while time.monotonic() < deadline and not (
        [r for r in _records(toy_root, "clean") if r["status"] == "match"]
        and _records(toy_root, "hang")
    ):
        time.sleep(0.2)
    time.sleep(3)  # the hang cell's ranks are blocking
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED
    _one_error_line(stderr, "interrupted", "kept under")
    assert _records(toy_root, "clean")[0]["status"] == "match"
    assert _records(toy_root, "hang")[0]["reason"] == "interrupted"
    assert _leftovers(toy_root) == []


def test_bad_input_is_one_line_and_exit_2(toy_root: Path) -> None:
    done = reprobox("run", "toi")
    assert done.returncode == ExitCode.BAD_INPUT
    _one_error_line(done.stderr, "unknown repro 'toi'", "did you mean 'toy'")
    done = reprobox("run", "toy", "--with", "accelerate==1.0.0")
    _one_error_line(done.stderr, "not a package that toy pins")
    done = reprobox("run", "toy", "--variant", "nope")
    _one_error_line(done.stderr, "has no variant 'nope'")


def test_a_version_that_does_not_exist(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "clean", "--with", "numpy==1.99.99")
    assert done.returncode == ExitCode.BAD_INPUT
    _one_error_line(done.stderr, "no such version: numpy==1.99.99")


def test_a_missing_fix_module(toy_root: Path) -> None:
    (toy_root / "fixes" / "toy_fix.py").unlink()
    done = reprobox("run", "toy")
    assert done.returncode == ExitCode.BAD_INPUT
    _one_error_line(done.stderr, "repro.toml: variants.fixed.fix", "'toy_fix' not found")


def test_a_stale_lock_is_refused(toy_root: Path) -> None:
    locks = toy_root / "repros" / "toy" / "locks"
    locks.mkdir()
    (locks / "clean.cpu.txt").write_text("# reprobox-lock input=0000\ntorch==2.13.0\n")
    done = reprobox("run", "toy", "--variant", "clean")
    assert done.returncode == ExitCode.BAD_INPUT
    _one_error_line(done.stderr, "is stale", "nox -s lock -- toy")
