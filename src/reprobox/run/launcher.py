"""Start a repro's ranks with the launcher the stack ships, and always clean up after them.

torchrun and `accelerate launch` are used as they are; the plain `python` launcher starts N
processes with the torch.distributed environment (RANK, WORLD_SIZE, MASTER_PORT, ...) itself.
nox has no timeouts, so this module owns them, and it makes sure nothing outlives a launch:

- every process of a launch carries a run id in its environment, and each process the harness
  starts leads a session of its own; on timeout, Ctrl-C, SIGTERM or SIGHUP each such group
  gets SIGTERM, then SIGKILL after a grace (at once on a second signal: nox sends SIGTERM
  0.3 s after SIGINT and SIGKILL 0.2 s later);
- while it runs, the launch's process tree is tracked (pids with start times, and the
  sessions and groups its processes create), so a daemon that double-forks, calls setsid
  and clears its environment is still found; each launched process is a child subreaper
  (orphans of its tree stay below it) and so is the harness during a launch;
- at the end everything tracked, grouped or carrying the run id is killed, however the
  launch ended;
- if the harness itself dies (kill -9), a watchdog process (`reprobox.run.watchdog`) that
  holds a pipe from the harness kills all of it when the pipe closes; the processes the
  harness started are stopped by a parent-death signal first, so their orphans stay below
  them until the watchdog has walked the tree (killed, if no watchdog could be started);
- live runs are registered under the cache folder with the harness's pid; a launch first
  kills the processes of runs whose harness is dead (the watchdog's backstop).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, TextIO

from reprobox.core import env_filter
from reprobox.core.errors import LaunchError
from reprobox.core.processes import signal_group
from reprobox.core.scrub import Scrubber
from reprobox.core.spec import check_timeout
from reprobox.core.spec_rules import refuse_nodes
from reprobox.run import interrupts, multinode, phases, sitehook, watchdog, zygote
from reprobox.run.guard import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    Guard,
    prctl,
    sweep_stale_runs,
)
from reprobox.run.layout import launcher_argv
from reprobox.run.rank_logs import bound_logs, collect_rank_logs

RUN_ID_ENV = watchdog.RUN_ID_ENV
TERM_GRACE_S = 5.0
# When one rank of the plain launcher fails, its peers are usually stuck in a collective.
PEER_GRACE_S = 30.0
POLL_S = 0.05  # the longest wait between two looks at the launch (its log, the deadline)


def free_port() -> int:
    """A TCP port that is free on loopback now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LaunchPlan:
    """One launch: what to start, where, for how long, and where its logs go."""

    launcher: str  # torchrun | accelerate | python
    bin_dir: Path  # the venv's bin/
    processes: int
    script: Path
    script_args: Sequence[str]
    timeout: float
    log_dir: Path
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    launcher_args: Sequence[str] = ()
    config: Path | None = None
    port: int = 0
    rank_logs: bool = True  # ask the launcher for per-rank logs (see collect_rank_logs)
    log_name: str = "launch.log"  # the launcher's output, in log_dir
    registry: Path | None = None  # the folder of live runs (stale ones are swept at start)
    # Where it sits in a launch over nodes (run.multinode): set on each node by its runner.
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = ""  # the rendezvous host; "" is this machine (one node)
    rdzv_id: str = ""
    # The plain launcher's warm start: modules imported once before the ranks are forked
    # (run.zygote); empty, each rank is a fresh interpreter. argv() stays the cold command.
    fork: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The command line a person would type (also what the report quotes)."""
        return launcher_argv(
            self.launcher, self.bin_dir, self.processes, self.script, self.script_args,
            launcher_args=self.launcher_args, config=self.config, port=self.port,
            log_dir=self.log_dir, rank_logs=self.rank_logs, placement=self._placement(),
        )  # fmt: skip

    def _placement(self) -> list[str] | None:
        """The launcher's options for where this node sits (run.multinode)."""
        if self.launcher == "torchrun":
            return multinode.torchrun_args(self)
        if self.launcher == "accelerate":
            return multinode.accelerate_args(self)
        return None


@dataclass(frozen=True)
class LaunchOutcome:
    returncode: int | None  # None when killed for a timeout or interrupt
    wall_s: float
    timed_out: bool
    log: Path
    rank_logs: list[Path]
    killed_orphans: int = 0
    codes: tuple[int | None, ...] = ()  # each started process's own status, in rank order
    stacks: tuple[Path, ...] = ()  # Python stacks dumped at a timeout (sitehook), one a process


def one_process(plan: LaunchPlan, args: Sequence[str], log_name: str) -> LaunchPlan:
    """`plan` as one plain process of the script with `args` appended (a preflight): the same
    environment, working folder, timeout and clean-up as the launch, none of its launcher's
    options, and its output in `log_name` beside the launch's."""
    return replace(
        plan,
        launcher="python",
        processes=1,
        script_args=[*plan.script_args, *args],
        launcher_args=(),
        config=None,
        rank_logs=False,
        log_name=log_name,
        nodes=1,
        fork=(),
    )


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a process the harness starts in a repro's venv: the stack's own
    set of the harness's variables (`env_filter.for_launch`: never its secrets) and `extra`."""
    env = {**env_filter.for_launch(os.environ), **extra, "PYTHONUNBUFFERED": "1"}
    # Let the processes cache bytecode in the (harness-owned) venv: with
    # PYTHONDONTWRITEBYTECODE set, every rank of every launch recompiles torch & co.;
    # compiling whole envs at install instead costs ~10 s per env (too much for probes).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(plan: LaunchPlan, echo: TextIO | None = None) -> LaunchOutcome:
    """Run the launch to completion or timeout and kill whatever it leaves; an interrupt
    (KeyboardInterrupt, `Terminated`) kills it all and propagates."""
    check_timeout(plan.timeout, "launch timeout")
    if not plan.master_addr:
        refuse_nodes(plan.nodes)  # placed on no node: a single-machine back end
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if plan.registry is not None:
        sweep_stale_runs(plan.registry)
    run_id = uuid.uuid4().hex
    env = child_env({**plan.env, RUN_ID_ENV: run_id})
    env["MASTER_ADDR"], env["MASTER_PORT"] = plan.master_addr or "127.0.0.1", str(plan.port)
    log = plan.log_dir / plan.log_name
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    stacks: list[Path] = []
    timed_out = finished = interrupted = False
    with log.open("wb") as sink:
        sink.write(f"$ {' '.join(plan.argv())}\n".encode())
        sink.flush()
        guard = Guard(run_id, plan.registry)
        try:
            procs = _start(plan, env, sink, watched=guard.watched)
            phases.emit(phases.PhaseKind.RUNNING, _started(plan, procs))
            guard.watch(procs)
            timed_out = _wait(procs, started + plan.timeout, log, echo, guard)
            finished = True
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            # No signal may cut this short; one that arrives makes it kill at once, and is
            # raised after it unless an interrupt is already on its way.
            with interrupts.shielded(raise_pending=not interrupted):
                # where each process was stuck, before it is killed (else: no empty files)
                stacks = sitehook.dump_stacks(plan.log_dir, guard.launch.pids if timed_out else {})
                if timed_out or not finished:
                    _terminate(procs)
                orphans = guard.close(procs)
    codes = _rank_codes(plan, procs)
    returncode = None if timed_out else zygote.combined_code(codes)
    return LaunchOutcome(
        returncode=returncode,
        codes=tuple(codes),
        wall_s=time.monotonic() - started,
        timed_out=timed_out,
        log=log,
        rank_logs=collect_rank_logs(plan.log_dir) if plan.rank_logs else _bounded(plan.log_dir),
        killed_orphans=orphans,
        stacks=tuple(stacks),
    )


def _rank_codes(plan: LaunchPlan, procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """Each started process's status; a warm start's ranks' own, as its zygote left them
    (none left: it was killed, and its status is all there is)."""
    codes = [p.returncode for p in procs]
    written = plan.log_dir / zygote.CODES_FILE
    if plan.fork and written.is_file():
        try:
            ranks = json.loads(written.read_text())
        except (OSError, ValueError):
            return codes
        finally:
            written.unlink(missing_ok=True)
        if isinstance(ranks, list) and len(ranks) == plan.processes:
            return [c if isinstance(c, int) else None for c in ranks]
    return codes


def _started(plan: LaunchPlan, procs: list[subprocess.Popen[bytes]]) -> str:
    """What is known to be up: the harness's own ranks, or a launcher (torchrun) that starts
    its ranks itself."""
    if len(procs) > 1 or plan.processes == 1:
        return f"{len(procs)} process{'es' * (len(procs) != 1)} started"
    return f"{plan.launcher} started for {plan.processes} processes"


def _bounded(log_dir: Path) -> list[Path]:
    """No per-rank logs asked for: the launch's own logs are still capped and scrubbed."""
    bound_logs(log_dir)
    return []


def _child_setup(parent: int, watched: bool) -> Callable[[], None]:
    """Run in each launched process before its program: the orphans of its tree are
    re-parented to it rather than to init (so they stay in the tree), and it gets a signal
    when the harness dies. With a watchdog that signal is SIGSTOP: a stopped rank still holds
    its orphans (a daemon that left its group, session and environment) when the watchdog
    walks the tree and kills it all. Without one it is SIGKILL.

    Each launched process leads a session of its own (Ctrl-C in the terminal reaches only the
    harness, which cleans up). In the harness's session, a killed harness with more than one
    thread left its stopped ranks in a newly orphaned process group, which the kernel sends
    SIGHUP and SIGCONT: the ranks died, and a daemon below them went to init, unseen by the
    watchdog (7 of 12 kill -9 runs of the stubborn repro under load). A group in another
    session is never orphaned that way."""
    death = int(signal.SIGSTOP if watched else signal.SIGKILL)

    def setup() -> None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        prctl(PR_SET_PDEATHSIG, death)
        if os.getppid() != parent:  # the harness died before the parent-death signal was set
            os._exit(128 + int(signal.SIGKILL))

    return setup


def _start(
    plan: LaunchPlan, env: dict[str, str], sink: BinaryIO, watched: bool
) -> list[subprocess.Popen[bytes]]:
    argv = plan.argv()
    setup = _child_setup(os.getpid(), watched)
    try:
        ranks_by_harness = multinode.harness_ranks(plan.launcher, plan.processes, plan.nodes)
        if not ranks_by_harness or plan.fork:
            command, one_env = argv, env
            if ranks_by_harness:  # a warm start: one interpreter forks the ranks (run.zygote)
                ranks = [multinode.rank_env(plan, rank) for rank in range(plan.processes)]
                command, one_env = _zygote_argv(plan), {**env, zygote.RANKS_ENV: json.dumps(ranks)}
            proc = subprocess.Popen(
                command,
                cwd=plan.cwd,
                env=one_env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # see _child_setup: Ctrl-C reaches only the harness
                preexec_fn=setup,
            )
            return [proc]
        procs: list[subprocess.Popen[bytes]] = []
        for rank in range(plan.processes):
            rank_env = {**env, **multinode.rank_env(plan, rank)}
            with (plan.log_dir / f"rank{rank}.log").open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=plan.cwd,
                        env=rank_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # see _child_setup
                        preexec_fn=setup,
                    )
                )
        return procs
    except OSError as exc:
        # Ranks already started carry the run id: the clean-up's sweep finds them.
        raise LaunchError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _zygote_argv(plan: LaunchPlan) -> list[str]:
    """The warm start's command: run.zygote, run as a script by the environment's python."""
    return [
        str(plan.bin_dir / "python"), zygote.__file__, "--imports", ",".join(plan.fork),
        "--log-dir", str(plan.log_dir), "--peer-grace", str(PEER_GRACE_S),
        str(plan.script), *plan.script_args,
    ]  # fmt: skip


ECHO_LINE_MAX = 1 << 16  # a line longer than this is echoed before it ends


def _wait(
    procs: list[subprocess.Popen[bytes]],
    deadline: float,
    log: Path,
    echo: TextIO | None,
    guard: Guard,
) -> bool:
    """Poll until every process exits; True when the deadline passed first."""
    echoed = 0
    scrub = Scrubber(paths=False) if echo is not None else None
    first_failure: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        done = all(code is not None for code in codes)
        if echo is not None and scrub is not None:
            echoed = _echo_new(log, echoed, echo, scrub, final=done)
        if done:
            return False
        guard.track()
        now = time.monotonic()
        if now > deadline:
            return True
        if first_failure is None and any(code not in (None, 0, 1, 125) for code in codes):
            first_failure = now
        if first_failure is not None and now - first_failure > PEER_GRACE_S:
            _terminate(procs)
            return False
        _until_one_ends(procs, codes, POLL_S)


def _until_one_ends(
    procs: list[subprocess.Popen[bytes]], codes: list[int | None], timeout: float
) -> None:
    """Wait at most `timeout` for the first running process to end: a launch that ends is
    seen within milliseconds, not at the next tick (a fixed sleep added half a tick, ~25 ms,
    to every launch). A Ctrl-C here still reaches `run` at once: Popen.wait's own grace for
    a child that got the same SIGINT is capped by `timeout`."""
    running = [p for p, code in zip(procs, codes, strict=True) if code is None]
    try:
        running[0].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def _echo_new(log: Path, offset: int, echo: TextIO, scrub: Scrubber, final: bool) -> int:
    """Echo the log's new whole lines, scrubbed (a terminal's output lands in CI logs); a
    line is echoed only once complete, so no secret is cut across two writes and missed."""
    with log.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    end = len(chunk) if final or len(chunk) > ECHO_LINE_MAX else chunk.rfind(b"\n") + 1
    if end:
        echo.write(scrub.text(chunk[:end].decode(errors="replace")))
        echo.flush()
    return offset + end


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the launch's process groups (each process it started leads one), then SIGKILL
    whatever is left after a grace (at once when a second signal came: see
    `interrupts.urgent`). A rank already reaped gets nothing: its group id may be another's
    now (`signal_group`); what it left is killed by identity in `Guard.close`."""
    if not procs:
        return
    live = [p for p in procs if p.returncode is None]
    for proc in live:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while (
        time.monotonic() < deadline and not interrupts.urgent() and any(_running(p) for p in live)
    ):
        time.sleep(0.05)
    for proc in live:
        signal_group(proc, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _running(proc: subprocess.Popen[bytes]) -> bool:
    """Whether `proc` still runs, without reaping it (a zombie's id stays ours, so its group
    can still be signalled): `waitid` with WNOWAIT."""
    if proc.returncode is not None:
        return False
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False
