"""The launcher: command lines, per-rank logs, timeouts and interrupts that leave nothing
running. Uses this interpreter as the 'venv' python, so no environment is built."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from reprobox.core.errors import BadInput, ExitCode, Terminated, interrupt_code
from reprobox.run import interrupts, sitehook
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


def test_each_launched_process_leads_a_session_of_its_own(tmp_path: Path, bin_dir: Path) -> None:
    """In the harness's session, a killed harness (with threads) left its stopped ranks in a
    newly orphaned process group, which the kernel sends SIGHUP and SIGCONT: they died and
    their daemon went to init, unseen (tests/bench/bench_kill9.py measures it under load)."""
    plan = _plan(tmp_path, bin_dir, """
        import os
        print("leads", os.getsid(0) == os.getpid() == os.getpgrp())
    """, processes=2)  # fmt: skip
    assert launch.run(plan).returncode == 0
    for rank in (0, 1):
        assert "leads True" in (tmp_path / "logs" / f"rank{rank}.log").read_text()
    one = _plan(tmp_path, bin_dir, """
        import os
        print("one leads", os.getsid(0) == os.getpid() == os.getpgrp())
    """)  # fmt: skip
    assert launch.run(one).returncode == 0
    assert "one leads True" in (tmp_path / "logs" / "launch.log").read_text()


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


def _wait_until(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


STUBBORN = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleep = [sys.executable, "-c",
             "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"]
    subprocess.Popen([*sleep, "{token}-child"])
    subprocess.Popen([*sleep, "{token}-escaped"], start_new_session=True)
    print("started", flush=True)
    time.sleep(300)
"""

# The classic daemon: fork, setsid, fork again, the middle process exits at once, and the
# daemon clears its environment, so neither the launch's group, its session nor the run id
# in the environment leads to it.
DAEMON = """
    import os, sys, time
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)",
                                   "{token}-daemon"], {{}})
    os.waitpid(child, 0)
"""


def test_a_daemon_that_clears_its_environment_is_killed(tmp_path: Path, bin_dir: Path) -> None:
    token = f"reprobox-test-daemon-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, DAEMON.format(token=token), processes=2)
    outcome = launch.run(plan)  # the ranks exit at once, the daemons stay
    assert outcome.returncode == 0
    assert outcome.killed_orphans >= 2
    time.sleep(0.3)
    assert _alive_with(token) == []


def test_a_second_signal_kills_at_once(tmp_path: Path, bin_dir: Path) -> None:
    """nox: SIGINT, then SIGTERM 0.3 s later; the ranks ignore SIGTERM. The clean-up must
    not wait out its grace (nox SIGKILLs the harness 0.2 s later) nor stop half way."""
    token = f"reprobox-test-second-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, STUBBORN.format(token=token))
    second = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))

    class Nox:
        sent = 0.0

        def write(self, text: str) -> None:
            if "started" in text and not self.sent:
                self.sent = time.monotonic()
                second.start()
                os.kill(os.getpid(), signal.SIGINT)

        def flush(self) -> None: ...

    nox = Nox()
    with interrupts.handled(), pytest.raises(KeyboardInterrupt) as raised:
        launch.run(plan, echo=nox)
    second.join()
    assert type(raised.value) is KeyboardInterrupt  # the first signal's, not the second's
    assert time.monotonic() - nox.sent < launch.TERM_GRACE_S - 1  # no grace waited out
    assert _wait_until(lambda: _alive_with(token) == [], 3)


def test_sigterm_is_an_interrupt_with_its_exit_code(tmp_path: Path, bin_dir: Path) -> None:
    token = f"reprobox-test-term-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, STUBBORN.format(token=token))

    class Term:
        def write(self, text: str) -> None:
            if "started" in text:
                os.kill(os.getpid(), signal.SIGTERM)

        def flush(self) -> None: ...

    with interrupts.handled(), pytest.raises(Terminated) as raised:
        launch.run(plan, echo=Term())
    assert raised.value.exit_code == ExitCode.TERMINATED == 143
    assert interrupt_code(Terminated(signal.SIGHUP)) == ExitCode.HANGUP == 129
    assert interrupt_code(KeyboardInterrupt()) == ExitCode.INTERRUPTED
    assert _wait_until(lambda: _alive_with(token) == [], 3)


def test_a_signal_during_a_timeouts_clean_up_is_raised_after_it(
    tmp_path: Path, bin_dir: Path
) -> None:
    token = f"reprobox-test-late-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, STUBBORN.format(token=token), timeout=1)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))  # inside the grace
    started = time.monotonic()
    with interrupts.handled(), pytest.raises(Terminated):
        timer.start()
        launch.run(plan)
    timer.join()
    assert time.monotonic() - started < 1 + launch.TERM_GRACE_S  # it killed at once
    assert _wait_until(lambda: _alive_with(token) == [], 3)


def test_one_process_runs_under_the_same_guard(tmp_path: Path, bin_dir: Path) -> None:
    """The preflight: one plain process of the script, the caller's timeout, the launch's
    environment, its own log; what it starts is killed like a launch's."""
    token = f"reprobox-test-preflight-{time.time_ns()}"
    plan = _plan(tmp_path, bin_dir, """
        import os, subprocess, sys, time
        print("args", sys.argv[1:], "rank" in os.environ, os.environ["REPROBOX_RUN_ID"] != "")
        sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
        subprocess.Popen([*sleep, sys.argv[-1]], start_new_session=True)
        time.sleep(300)
    """, launcher="torchrun", processes=4, timeout=2, launcher_args=["--standalone"],
        config=tmp_path / "x.yaml")  # fmt: skip
    single = launch.one_process(plan, ["--preflight", token], "preflight.log")
    assert single.argv() == [str(bin_dir / "python"), str(plan.script), "--x", "--preflight",
                             token]  # fmt: skip
    started = time.monotonic()
    outcome = launch.run(single)
    assert outcome.timed_out and outcome.returncode is None
    assert time.monotonic() - started < 2 + launch.TERM_GRACE_S + 5
    assert outcome.log == tmp_path / "logs" / "preflight.log"
    assert not (tmp_path / "logs" / "launch.log").exists() and outcome.rank_logs == []
    text = outcome.log.read_text()
    assert text.startswith(f"$ {bin_dir / 'python'} ")
    assert f"args ['--x', '--preflight', '{token}'] False True" in text
    assert outcome.killed_orphans >= 1
    assert _wait_until(lambda: _alive_with(token) == [], 3)

    quick = launch.one_process(_plan(tmp_path, bin_dir, "import sys; sys.exit(125)"), [], "p.log")
    done = launch.run(quick)
    assert done.returncode == 125 and done.codes == (125,) and not done.timed_out


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, 0.0])
def test_a_timeout_that_is_no_timeout_is_refused(
    tmp_path: Path, bin_dir: Path, timeout: float
) -> None:
    with pytest.raises(BadInput, match=r"launch timeout: .* finite number of seconds > 0"):
        launch.run(_plan(tmp_path, bin_dir, "", timeout=timeout))


def test_kill_9_of_the_harness_leaves_nothing(tmp_path: Path, bin_dir: Path) -> None:
    """The harness dies without clean-up: its ranks get the parent-death signal, and the
    watchdog kills their children, the escaped ones and the daemons."""
    token = f"reprobox-test-kill9-{time.time_ns()}"
    body = textwrap.dedent(DAEMON) + textwrap.dedent(STUBBORN)
    plan = _plan(tmp_path, bin_dir, body.format(token=token), processes=2)
    harness = tmp_path / "harness.py"
    harness.write_text(textwrap.dedent(f"""
        import pickle, sys
        from reprobox.run import launcher
        launcher.run(pickle.loads({pickle.dumps(plan)!r}))
    """))  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(harness)])
    # two ranks, each with a child, an escaped child and a daemon
    assert _wait_until(lambda: len(_alive_with(token)) >= 6, 30), _alive_with(token)
    time.sleep(0.5)  # the daemons are old enough to have been tracked, or not: either way
    proc.kill()
    proc.wait()
    assert _wait_until(lambda: _alive_with(token) == [], 5), [
        p.info["cmdline"] for p in _alive_with(token)
    ]


def test_the_next_launch_sweeps_runs_whose_harness_died(
    tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Belt and braces behind the watchdog: a run whose harness is dead (and whose watchdog
    did not finish either) is swept by the next launch, by its run id."""
    token = f"reprobox-test-stale-{time.time_ns()}"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    runs = tmp_path / "cache" / "runs"
    runs.mkdir(parents=True)
    stale = {"run_id": "stale" + token[-8:], "harness": dead.pid, "started": time.time() - 60}
    (runs / f"{stale['run_id']}.json").write_text(json.dumps(stale))
    me = psutil.Process()
    live = {"run_id": "live" + token[-8:], "harness": me.pid, "started": me.create_time()}
    (runs / f"{live['run_id']}.json").write_text(json.dumps(live))
    # another node's entry (a cache on a shared file system): its harness's pid means
    # nothing here, and its run's processes here are a multi-node launch's ranks
    elsewhere = {**stale, "run_id": "node" + token[-8:], "host": "another-node"}
    (runs / f"{elsewhere['run_id']}@another-node.json").write_text(json.dumps(elsewhere))
    (runs / "torn.json").write_text('{"run_id": ')
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    orphans = [
        subprocess.Popen([*sleep, token], env={**os.environ, launch.RUN_ID_ENV: run["run_id"]})
        for run in (stale, live, elsewhere)
    ]
    try:
        outcome = launch.run(_plan(tmp_path, bin_dir, "print('hi')", registry=runs))
        assert outcome.returncode == 0
        assert orphans[0].wait(timeout=5) == -signal.SIGKILL  # the dead harness's: killed
        assert orphans[1].poll() is None  # a live harness's: left alone
        assert orphans[2].poll() is None  # another host's: not this sweep's to judge
        assert sorted(p.name for p in runs.iterdir()) == sorted(
            [f"{live['run_id']}.json", f"{elsewhere['run_id']}@another-node.json"]
        )
    finally:
        for orphan in orphans:
            orphan.kill()
            orphan.wait()


def test_the_wait_between_looks_ends_when_a_process_does() -> None:
    """`_wait` looks at the launch every POLL_S at most, and sooner when a process ends: an
    ended launch is seen at once, not at the next tick; one still running is waited for
    no longer than the tick."""
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = time.monotonic()
        launch._until_one_ends([slow, quick], [None, None], 0.2)
        assert 0.15 < time.monotonic() - started < 5  # slow is the first running: the tick
        started = time.monotonic()
        launch._until_one_ends([quick, slow], [None, None], 20.0)
        assert time.monotonic() - started < 10 and quick.returncode == 0  # not the 20 s
        started = time.monotonic()
        launch._until_one_ends([quick, slow], [0, None], 0.2)  # quick ended: slow's tick
        assert 0.15 < time.monotonic() - started < 5
    finally:
        slow.kill()
        slow.wait()


def _foreign(token: str) -> subprocess.Popen[bytes]:
    """A process the harness did not start: a group and session leader, as another job's
    rank is, without the run id."""
    env = {k: v for k, v in os.environ.items() if k != launch.RUN_ID_ENV}
    sleep = [sys.executable, "-c", "import time; time.sleep(300)", token]
    return subprocess.Popen(sleep, env=env, start_new_session=True)


def test_a_recycled_group_id_never_kills_a_foreign_process(tmp_path: Path) -> None:
    """The watchdog was told a group and a session whose ids are now a foreign process's
    (its leader is gone and the id was given out again, as on a shared machine with
    pid_max 32768): the foreign process survives the watchdog's kill. The same ids with the
    leader the launch knew (same start time) kill it: the test can fail."""
    token = f"reprobox-test-recycled-{time.time_ns()}"
    foreign = _foreign(token)
    try:
        started = psutil.Process(foreign.pid).create_time()
        old_leader = started - 7.5  # the launch's rank that had this pid, long reaped
        ids = f"{foreign.pid}"
        for told in ([f"group {ids} {old_leader!r}", f"session {ids} {old_leader!r}"],
                     [f"group {ids}", f"session {ids}"]):  # fmt: skip
            dog = subprocess.Popen(
                [sys.executable, "-m", "reprobox.run.watchdog", "run-recycled"],
                stdin=subprocess.PIPE,
            )
            assert dog.stdin is not None
            dog.stdin.write("".join(f"{line}\n" for line in told).encode())
            dog.stdin.close()  # no "done": as when the harness is killed
            assert dog.wait(timeout=60) == 0
            assert foreign.poll() is None, told  # alive: not the launch's
        killed = launch.watchdog.kill(
            launch.watchdog.LaunchProcesses("run-recycled", groups={foreign.pid: started})
        )
        assert killed == 1 and foreign.wait(timeout=10) == -signal.SIGKILL
    finally:
        foreign.kill()
        foreign.wait()


def test_a_reaped_rank_s_group_id_is_never_signalled(tmp_path: Path) -> None:
    """The launcher's clean-up signals the group of each rank it started; a rank it already
    reaped gets nothing, since its id may lead a foreign group now. Here the reaped rank's
    pid is a foreign group leader's (the recycled id), and the clean-up leaves it alone."""
    token = f"reprobox-test-reaped-{time.time_ns()}"
    rank = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    rank.wait()
    foreign = _foreign(token)
    try:
        rank.pid = foreign.pid  # the id the kernel gave out again
        launch._terminate([rank])
        with pytest.raises(subprocess.TimeoutExpired):
            foreign.wait(timeout=1)  # alive: not the launch's
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                start_new_session=True)  # fmt: skip
        launch._terminate([live])  # an unreaped rank: its group is still its own
        assert live.returncode == -signal.SIGTERM
    finally:
        foreign.kill()
        foreign.wait()


def test_a_hung_launch_leaves_each_python_process_s_stacks(tmp_path: Path, bin_dir: Path) -> None:
    """With the harness's sitecustomize on the path, a launch past its timeout is asked for
    every thread's Python stack before it is killed: the dump names the function each rank
    was stuck in. A launch that ends by itself leaves no stack files."""
    hook = sitehook.hook_dir(tmp_path / "cache")
    env = {"PYTHONPATH": str(hook), **sitehook.launch_env(tmp_path / "logs", [tmp_path / "r"])}
    plan = _plan(tmp_path, bin_dir, """
        import threading, time
        def stuck_in_a_collective():
            threading.Event().wait()
        stuck_in_a_collective()
    """, processes=2, timeout=3, env=env)  # fmt: skip
    outcome = launch.run(plan)
    assert outcome.timed_out and len(outcome.stacks) == 2, outcome
    for dump in outcome.stacks:
        assert dump.parent == tmp_path / "logs" / sitehook.STACKS
        assert "in stuck_in_a_collective" in dump.read_text(), dump.read_text()
    env = {"PYTHONPATH": str(hook), **sitehook.launch_env(tmp_path / "ended", [tmp_path / "r"])}
    ended = _plan(tmp_path, bin_dir, "print('done')", processes=2, env=env,
                  log_dir=tmp_path / "ended")  # fmt: skip
    outcome = launch.run(ended)
    assert outcome.returncode == 0 and outcome.stacks == ()
    assert not (tmp_path / "ended" / sitehook.STACKS).exists()
