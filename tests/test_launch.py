"""The launcher: command lines, per-rank logs, timeouts and interrupts that leave nothing
running. Uses this interpreter as the 'venv' python, so no environment is built."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from reprobox.run import launcher as launch


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "venv" / "bin"
    directory.mkdir(parents=True)
    (directory / "python").symlink_to(sys.executable)
    return directory


def _plan(tmp_path: Path, bin_dir: Path, body: str, **over: object) -> launch.LaunchPlan:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    fields = dict(
        launcher="python", bin_dir=bin_dir, processes=1, script=script, script_args=["--x"],
        timeout=30, log_dir=tmp_path / "logs", cwd=tmp_path, port=launch.free_port(),
    )  # fmt: skip
    fields.update(over)
    return launch.LaunchPlan(**fields)


def _alive_with(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if token in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_command_lines(tmp_path: Path, bin_dir: Path) -> None:
    plan = _plan(tmp_path, bin_dir, "", launcher="torchrun", processes=4, port=1234,
                 launcher_args=["--start_method", "fork"])  # fmt: skip
    argv = plan.argv()
    assert argv[0].endswith("bin/torchrun")
    assert argv[argv.index("--nproc_per_node") + 1] == "4"
    assert argv[argv.index("--master_port") + 1] == "1234"
    assert argv[-4:] == ["--start_method", "fork", str(plan.script), "--x"]
    accel = _plan(tmp_path, bin_dir, "", launcher="accelerate", processes=2, port=99,
                  config=tmp_path / "cfg.yaml").argv()  # fmt: skip
    assert accel[1:4] == ["launch", "--config_file", str(tmp_path / "cfg.yaml")]
    assert accel[accel.index("--num_processes") + 1] == "2"
    assert accel[accel.index("--main_process_port") + 1] == "99"


def test_free_ports_differ() -> None:
    assert len({launch.free_port() for _ in range(5)}) > 1


def test_python_launcher_gives_each_rank_its_env_and_log(tmp_path: Path, bin_dir: Path) -> None:
    plan = _plan(tmp_path, bin_dir, """
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"])
    """, processes=3)  # fmt: skip
    outcome = launch.run(plan)
    assert outcome.returncode == 0 and not outcome.timed_out
    logs = {p.name: p.read_text() for p in outcome.rank_logs}
    assert sorted(logs) == ["rank0.log", "rank1.log", "rank2.log"]
    assert logs["rank2.log"].strip() == f"rank 2 of 3 {plan.port}"


def test_timeout_kills_the_tree_and_escaped_children(tmp_path: Path, bin_dir: Path) -> None:
    token = f"reprobox-test-{os.getpid()}-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, f"""
        import subprocess, sys, time
        sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
        subprocess.Popen([*sleep, "{token}-child"])
        subprocess.Popen([*sleep, "{token}-escaped"], start_new_session=True)
        time.sleep(300)
    """, processes=2, timeout=3)  # fmt: skip
    started = time.monotonic()
    outcome = launch.run(plan)
    assert outcome.timed_out and outcome.returncode is None
    assert time.monotonic() - started < 3 + launch.TERM_GRACE_S + 10
    assert outcome.killed_orphans >= 2  # the escaped sleeps, found by the run marker
    time.sleep(0.5)
    assert _alive_with(token) == []


def test_interrupt_kills_everything_and_propagates(tmp_path: Path, bin_dir: Path) -> None:
    token = f"reprobox-test-int-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, f"""
        import subprocess, sys, time
        sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
        subprocess.Popen([*sleep, "{token}"], start_new_session=True)
        print("started", flush=True)
        time.sleep(300)
    """)  # fmt: skip

    class CtrlC:
        def write(self, text: str) -> None:
            if "started" in text:
                raise KeyboardInterrupt

        def flush(self) -> None: ...

    with pytest.raises(KeyboardInterrupt):
        launch.run(plan, echo=CtrlC())
    time.sleep(0.5)
    assert _alive_with(token) == []


def test_a_failed_rank_does_not_wait_for_the_timeout(tmp_path: Path, bin_dir: Path) -> None:
    plan = _plan(tmp_path, bin_dir, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(7)
        time.sleep(300)
    """, processes=2, timeout=120)  # fmt: skip
    original = launch.PEER_GRACE_S
    launch.PEER_GRACE_S = 1.0
    try:
        outcome = launch.run(plan)
    finally:
        launch.PEER_GRACE_S = original
    assert not outcome.timed_out
    assert outcome.returncode == 7
    assert outcome.wall_s < 30
