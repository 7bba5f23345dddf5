"""Faults a user meets, through the real CLI and nox: the harness sent SIGTERM or SIGHUP,
killed with -9, Ctrl-C'd under nox; ranks that ignore SIGTERM, daemons that leave the launch's
group, session and environment. Nothing may be left running.

Over the stubborn fixture repro (tests/fixtures/repros/stubborn), which pins what the toy
pins and so shares its environment. Every process it starts keeps the scratch checkout's path
on its command line (or, for ranks, in their environment), which is what is counted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from conftest import FIXTURES
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e


@pytest.fixture
def stubborn_root(scratch_root: Path) -> Path:
    shutil.copytree(FIXTURES / "repros" / "stubborn", scratch_root / "repros" / "stubborn")
    return scratch_root


def _leftovers(root: Path) -> list[str]:
    """Processes of the scratch checkout's runs: by command line (ranks, torchrun, the
    daemon, whose environment is empty) or by a run id whose paths point into it."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            env = proc.environ() if str(root) not in cmdline else {}
        except psutil.Error:
            continue
        if str(root) in cmdline or (
            "REPROBOX_RUN_ID" in env and any(str(root) in value for value in env.values())
        ):
            found.append(f"{proc.pid} {cmdline}")
    return found


def _ready(root: Path) -> int:
    """How many ranks said they now ignore SIGTERM (python launcher: rank<N>.log; torchrun:
    launch.log, each line prefixed by --tee)."""
    runs = root / "results" / "stubborn"
    logs = [*runs.glob("*/*/rank*.log"), *runs.glob("*/*/launch.log")]
    return sum(log.read_text(errors="replace").count("stubborn: ready") for log in logs)


def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _harness(variant: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "stubborn", "--variant", variant],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _record(root: Path, variant: str) -> dict:
    (path,) = (root / "results" / "stubborn").glob(f"cpu-{variant}/*/record.json")
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [
        (signal.SIGTERM, ExitCode.TERMINATED, "terminated (SIGTERM)"),
        (signal.SIGHUP, ExitCode.HANGUP, "hung up (SIGHUP)"),
        (signal.SIGINT, ExitCode.INTERRUPTED, "interrupted"),
    ],
)
def test_a_signal_to_the_harness_ends_the_run_like_ctrl_c(
    stubborn_root: Path, sig: signal.Signals, code: ExitCode, said: str
) -> None:
    harness = _harness("stubborn")
    try:
        assert _wait_until(lambda: _ready(stubborn_root) >= 2, 120), _leftovers(stubborn_root)
        harness.send_signal(sig)
        _, stderr = harness.communicate(timeout=60)
    finally:
        harness.kill()
    assert harness.returncode == code, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("reprobox: error:")]
    assert len(errors) == 1 and said in errors[0] and "Traceback" not in stderr, stderr
    record = _record(stubborn_root, "stubborn")
    assert record["reason"] == "interrupted" and record["exit_code"] == code
    assert _leftovers(stubborn_root) == []


@pytest.mark.parametrize(
    ("variant", "started"),
    [("stubborn", 2), ("stubborn_torchrun", 3), ("daemon_stubborn", 3)],
)
def test_kill_9_of_the_harness_leaves_nothing(
    stubborn_root: Path, variant: str, started: int
) -> None:
    """No clean-up code of the harness runs: the parent-death signal ends what it started,
    the watchdog the rest (torchrun's workers, the daemon)."""
    harness = _harness(variant)
    try:
        assert _wait_until(lambda: _ready(stubborn_root) >= 2, 120), _leftovers(stubborn_root)
        assert len(_leftovers(stubborn_root)) >= started
    finally:
        harness.kill()
        harness.communicate()
    assert _wait_until(lambda: _leftovers(stubborn_root) == [], 5), _leftovers(stubborn_root)
    # nothing of the harness ran after the kill, yet the cell says what happened to it
    record = _record(stubborn_root, variant)
    assert record["status"] == "error" and record["verdict"] is None
    assert record["reason"].startswith("no verdict was recorded for this launch"), record


def test_a_daemon_that_clears_its_environment_does_not_outlive_the_run(
    stubborn_root: Path,
) -> None:
    """Rank 1 double-forks a daemon into its own session with an empty environment and
    exits at once: neither the group, the session nor the run id leads to it."""
    done = subprocess.run(
        [sys.executable, "-m", "reprobox", "run", "stubborn", "--variant", "daemon"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == ExitCode.OK, done.stderr
    assert _record(stubborn_root, "daemon")["status"] == "match"
    assert (
        "daemon: left" in (Path(_record(stubborn_root, "daemon")["dir"]) / "rank1.log").read_text()
    )
    assert _leftovers(stubborn_root) == []


NOXFILE = """
    import sys

    import nox


    @nox.session(venv_backend="none")
    def stubborn(session):
        session.run(sys.executable, "-m", "reprobox", "run", "stubborn", "--variant",
                    "{variant}", external=True)
"""


@pytest.mark.parametrize(
    ("variant", "whom"),
    [
        ("stubborn", "nox"),  # SIGINT to nox alone: the harness gets SIGTERM, then SIGKILL
        ("stubborn", "group"),  # Ctrl-C in a terminal: nox and the harness get SIGINT
        ("stubborn_torchrun", "group"),
        ("daemon_stubborn", "group"),
    ],
)
def test_ctrl_c_under_nox_leaves_nothing(
    stubborn_root: Path, tmp_path: Path, variant: str, whom: str
) -> None:
    """nox answers Ctrl-C by sending its command SIGTERM 0.3 s later and SIGKILL 0.2 s
    after that: far less than the harness's grace for ranks that ignore SIGTERM."""
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(textwrap.dedent(NOXFILE.format(variant=variant)))
    nox = subprocess.Popen(
        [sys.executable, "-m", "nox", "-f", str(noxfile), "-s", "stubborn"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job has
        # a terminal's foreground job takes Ctrl-C: not the SIG_IGN a shell gives a job it
        # starts in the background (`cmd &`), which this test's runner may have inherited
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert _wait_until(lambda: _ready(stubborn_root) >= 2, 120), _leftovers(stubborn_root)
        time.sleep(0.5)
        if whom == "nox":
            nox.send_signal(signal.SIGINT)
        else:
            os.killpg(nox.pid, signal.SIGINT)
        try:
            output, _ = nox.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:
            said = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else ""
            raise AssertionError(
                f"nox did not end 30 s after SIGINT; left: {_leftovers(stubborn_root)}; "
                f"said: {said or exc.output!r}"
            ) from None
    finally:
        nox.kill()
    assert nox.returncode != 0, output
    assert _wait_until(lambda: _leftovers(stubborn_root) == [], 5), (
        _leftovers(stubborn_root),
        output,
    )
