"""Start a repro's ranks with the launcher the stack ships, and always clean up after them.

torchrun and `accelerate launch` are used as they are; the plain `python` launcher starts N
processes with the torch.distributed environment (RANK, WORLD_SIZE, MASTER_PORT, ...) itself.
nox has no timeouts, so this module owns them, and it makes sure nothing outlives a launch:

- every process of a launch carries a run id in its environment, and the launch runs in its
  own process group; on timeout, Ctrl-C, SIGTERM or SIGHUP the group gets SIGTERM, then
  SIGKILL after a grace (at once on a second signal: nox sends SIGTERM 0.3 s after SIGINT
  and SIGKILL 0.2 s later);
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

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, TextIO

import psutil

from reprobox.core import environ
from reprobox.core.errors import LaunchError
from reprobox.core.spec import check_timeout
from reprobox.run import interrupts, watchdog

RUN_ID_ENV = watchdog.RUN_ID_ENV
TERM_GRACE_S = 5.0
# When one rank of the plain launcher fails, its peers are usually stuck in a collective.
PEER_GRACE_S = 30.0
# How often the launch's process tree is walked for new processes.
TRACK_EVERY_S = 0.25


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

    def argv(self) -> list[str]:
        """The command line a person would type (also what the report quotes)."""
        script = [str(self.script), *self.script_args]
        if self.launcher == "torchrun":
            # Underscore spellings: the only ones torch < 2.1 understands.
            logs = ["--log_dir", str(self.log_dir / "torchrun"), "--tee", "3"]
            return [
                str(self.bin_dir / "torchrun"),
                *("--nnodes", "1", "--nproc_per_node", str(self.processes)),
                *("--master_addr", "127.0.0.1", "--master_port", str(self.port)),
                *(logs if self.rank_logs else []),
                *self.launcher_args,
                *script,
            ]
        if self.launcher == "accelerate":
            config = ["--config_file", str(self.config)] if self.config else []
            # --tee prefixes each rank's lines ("[default1]:"), so launch.log splits per
            # rank; accelerate < 0.34 has no --log_dir to pass on.
            return [
                str(self.bin_dir / "accelerate"),
                "launch",
                *config,
                *("--num_processes", str(self.processes), "--main_process_port", str(self.port)),
                *(["--tee", "3"] if self.rank_logs else []),
                *self.launcher_args,
                *script,
            ]
        return [str(self.bin_dir / "python"), *self.launcher_args, *script]


@dataclass(frozen=True)
class LaunchOutcome:
    returncode: int | None  # None when killed for a timeout or interrupt
    wall_s: float
    timed_out: bool
    log: Path
    rank_logs: list[Path]
    killed_orphans: int = 0
    codes: tuple[int | None, ...] = ()  # each started process's own status, in rank order


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
    )


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a process the harness starts in a repro's venv: the stack's own
    set of the harness's variables (`environ.for_launch`: never its secrets) and `extra`."""
    env = {**environ.for_launch(os.environ), **extra, "PYTHONUNBUFFERED": "1"}
    # Let the processes cache bytecode in the (harness-owned) venv: with
    # PYTHONDONTWRITEBYTECODE set, every rank of every launch recompiles torch & co.;
    # compiling whole envs at install instead costs ~10 s per env (too much for probes).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(plan: LaunchPlan, echo: TextIO | None = None) -> LaunchOutcome:
    """Run the launch to completion or timeout and kill whatever it leaves; an interrupt
    (KeyboardInterrupt, `Terminated`) kills it all and propagates."""
    check_timeout(plan.timeout, "launch timeout")
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if plan.registry is not None:
        sweep_stale_runs(plan.registry)
    run_id = uuid.uuid4().hex
    env = child_env({**plan.env, RUN_ID_ENV: run_id})
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(plan.port)
    log = plan.log_dir / plan.log_name
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    timed_out = finished = interrupted = False
    with log.open("wb") as sink:
        sink.write(f"$ {' '.join(plan.argv())}\n".encode())
        sink.flush()
        guard = _Guard(run_id, plan.registry)
        try:
            procs = _start(plan, env, sink, watched=guard.watched)
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
                if timed_out or not finished:
                    _terminate(procs)
                orphans = guard.close(procs)
    codes = [p.returncode for p in procs]
    returncode = None if timed_out else _combined_code(codes)
    return LaunchOutcome(
        returncode=returncode,
        codes=tuple(codes),
        wall_s=time.monotonic() - started,
        timed_out=timed_out,
        log=log,
        rank_logs=collect_rank_logs(plan.log_dir) if plan.rank_logs else [],
        killed_orphans=orphans,
    )


# prctl(2) options (linux/prctl.h).
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _prctl(option: int, value: int) -> bool:
    return _LIBC is not None and _LIBC.prctl(option, value, 0, 0, 0) == 0


def _subreaper() -> int:
    """Whether this process is a child subreaper now (0 or 1)."""
    flag = ctypes.c_int(0)
    if _LIBC is not None:
        _LIBC.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value


def _child_setup(parent: int, watched: bool) -> Callable[[], None]:
    """Run in each launched process before its program: the orphans of its tree are
    re-parented to it rather than to init (so they stay in the tree), and it gets a signal
    when the harness dies. With a watchdog that signal is SIGSTOP: a stopped rank still holds
    its orphans (a daemon that left its group, session and environment) when the watchdog
    walks the tree and kills it all. Without one it is SIGKILL."""
    death = int(signal.SIGSTOP if watched else signal.SIGKILL)

    def setup() -> None:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _prctl(_PR_SET_PDEATHSIG, death)
        if os.getppid() != parent:  # the harness died before the parent-death signal was set
            os._exit(128 + int(signal.SIGKILL))

    return setup


def _start(
    plan: LaunchPlan, env: dict[str, str], sink: BinaryIO, watched: bool
) -> list[subprocess.Popen[bytes]]:
    argv = plan.argv()
    setup = _child_setup(os.getpid(), watched)
    try:
        if plan.launcher != "python" or plan.processes == 1:
            proc = subprocess.Popen(
                argv,
                cwd=plan.cwd,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,  # its own group: Ctrl-C reaches the harness, which cleans up
                preexec_fn=setup,
            )
            return [proc]
        procs: list[subprocess.Popen[bytes]] = []
        for rank in range(plan.processes):
            rank_env = {
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(plan.processes),
                "LOCAL_WORLD_SIZE": str(plan.processes),
            }
            with (plan.log_dir / f"rank{rank}.log").open("wb") as out:
                group = procs[0].pid if procs else 0  # one group for all ranks, led by rank 0
                procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=plan.cwd,
                        env=rank_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        process_group=group,
                        preexec_fn=setup,
                    )
                )
        return procs
    except OSError as exc:
        # Ranks already started carry the run id: the clean-up's sweep finds them.
        raise LaunchError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _wait(
    procs: list[subprocess.Popen[bytes]],
    deadline: float,
    log: Path,
    echo: TextIO | None,
    guard: _Guard,
) -> bool:
    """Poll until every process exits; True when the deadline passed first."""
    echoed = 0
    first_failure: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if echo is not None:
            echoed = _echo_new(log, echoed, echo)
        if all(code is not None for code in codes):
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
        time.sleep(0.05)


def _echo_new(log: Path, offset: int, echo: TextIO) -> int:
    with log.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    if chunk:
        echo.write(chunk.decode(errors="replace"))
        echo.flush()
    return offset + len(chunk)


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the launch's process group, then SIGKILL whatever is left after a grace (at
    once when a second signal came: see `interrupts.urgent`)."""
    live = [p for p in procs if p.poll() is None]
    if not procs:
        return
    pgid = procs[0].pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while (
        time.monotonic() < deadline
        and not interrupts.urgent()
        and any(p.poll() is None for p in live)
    ):
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Guard:
    """What makes sure one launch leaves nothing behind, whatever happens to the harness:
    the registry entry, the watchdog, the tracked process tree."""

    def __init__(self, run_id: str, registry: Path | None) -> None:
        self.launch = watchdog.LaunchProcesses(run_id)
        self._before = set(_children(os.getpid()))
        self._own = (os.getpgrp(), os.getsid(0))
        self._tracked_at = 0.0
        self._entry = _register(run_id, registry) if registry is not None else None
        env = {k: v for k, v in os.environ.items() if k != RUN_ID_ENV}
        entry = [str(self._entry)] if self._entry is not None else []
        try:
            self._watchdog: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "reprobox.run.watchdog", run_id, *entry],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                # not the harness's stderr: a caller reading it (nox, a pipe) sees it end when
                # the harness does, not when the watchdog has finished killing
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal is not for it
            )
        except OSError:
            self._watchdog = None  # the harness's own clean-up still runs
        self._was_subreaper = _subreaper()
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)

    @property
    def watched(self) -> bool:
        """Whether a watchdog guards the launch (it started and is still there)."""
        return self._watchdog is not None and self._watchdog.poll() is None

    def watch(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """The launch has started: tell the watchdog its group and processes."""
        if procs:
            self.launch.groups.add(procs[0].pid)
            self._send(f"group {procs[0].pid}")
        for proc in procs:
            try:
                started = psutil.Process(proc.pid).create_time()
            except psutil.Error:
                continue  # already gone
            self._add(proc.pid, started)

    def track(self, force: bool = False) -> None:
        """Walk the launch's process tree (at most every TRACK_EVERY_S) and remember every
        process in it, with the sessions and groups they made, also on the watchdog's side."""
        now = time.monotonic()
        if not force and now - self._tracked_at < TRACK_EVERY_S:
            return
        self._tracked_at = now
        # From every process seen so far that still runs (one that exited may have been
        # reaped, and its pid be someone else's now: the start time tells).
        stack = [pid for pid, started in self.launch.pids.items() if _started(pid) == started]
        seen = set(stack)
        while stack:
            for pid in _children(stack.pop()):
                started = _started(pid)
                if pid not in seen and started is not None:
                    seen.add(pid)
                    self._add(pid, started)
                    stack.append(pid)

    def _add(self, pid: int, started: float) -> None:
        if pid in self.launch.pids:
            return
        self.launch.pids[pid] = started
        self._send(f"pid {pid} {started!r}")
        try:
            group, session = os.getpgid(pid), os.getsid(pid)
        except OSError:
            return
        if group not in self._own and group not in self.launch.groups:
            self.launch.groups.add(group)
            self._send(f"group {group}")
        if session not in self._own and session not in self.launch.sessions:
            self.launch.sessions.add(session)
            self._send(f"session {session}")

    def _send(self, line: str) -> None:
        if self._watchdog is None or self._watchdog.stdin is None:
            return
        try:
            self._watchdog.stdin.write(f"{line}\n".encode())
            self._watchdog.stdin.flush()
        except OSError:
            self._watchdog = None  # it died: the harness's own clean-up still runs

    def _adopted(self, procs: list[subprocess.Popen[bytes]]) -> list[psutil.Process]:
        """Orphans of the launch re-parented to the harness (a subreaper during the launch)
        that the tracking did not see: started during the launch, outside the harness's own
        group or session (a thread's uv subprocess stays inside both)."""
        ours = {p.pid for p in procs}
        if self._watchdog is not None:
            ours.add(self._watchdog.pid)
        found = []
        for pid in _children(os.getpid()):
            try:
                if pid in ours or pid in self._before:
                    continue
                if pid in self.launch.pids or (os.getpgid(pid), os.getsid(pid)) != self._own:
                    found.append(psutil.Process(pid))
            except (psutil.Error, OSError):
                continue
        return found

    def close(self, procs: list[subprocess.Popen[bytes]]) -> int:
        """Kill everything of the launch still running; how many processes that was."""
        if interrupts.urgent() and self._watchdog is not None and self._watchdog.stdin:
            # A second signal: nox SIGKILLs the harness 0.2 s after its SIGTERM, and the
            # record of the interrupted cell is still to be saved. Closing the pipe without
            # "done" hands the sweep to the watchdog, which runs it at once and on its own.
            try:
                self._watchdog.stdin.close()
            except OSError:
                pass
            _prctl(_PR_SET_CHILD_SUBREAPER, self._was_subreaper)
            return 0
        self.track(force=True)
        adopted = self._adopted(procs)
        for child in adopted:
            self._add(child.pid, child.create_time())
        spare = [self._watchdog.pid] if self._watchdog is not None else []
        killed = watchdog.kill(self.launch, spare=spare)
        for child in adopted:  # our children now: reap them
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass
        self._send("done")
        if self._watchdog is not None:
            if self._watchdog.stdin is not None:
                try:
                    self._watchdog.stdin.close()
                except OSError:
                    pass
            # It exits on its own once it reads "done": reaped by a later launch, not
            # waited for here (its start-up would add to every launch's time).
            _FINISHED_WATCHDOGS.append(self._watchdog)
        _FINISHED_WATCHDOGS[:] = [w for w in _FINISHED_WATCHDOGS if w.poll() is None]
        if self._entry is not None:
            self._entry.unlink(missing_ok=True)
        _prctl(_PR_SET_CHILD_SUBREAPER, self._was_subreaper)
        return killed


_FINISHED_WATCHDOGS: list[subprocess.Popen[bytes]] = []


def _children(pid: int) -> list[int]:
    """The direct children of `pid`, from the kernel's per-thread children lists (cheap:
    psutil finds children by reading every process on the machine)."""
    if not _PROC_CHILDREN:
        try:
            return [child.pid for child in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def _started(pid: int) -> float | None:
    """When `pid` started (None: gone), to tell a process from a later one with its pid."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _register(run_id: str, registry: Path) -> Path | None:
    """Note the run as live, owned by this process; None when the cache folder is not
    writable (a full disk must not stop the launch: the watchdog still guards it)."""
    me = psutil.Process()
    entry = registry / f"{run_id}.json"
    tmp = entry.with_name(f".{entry.name}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(
            json.dumps({"run_id": run_id, "harness": me.pid, "started": me.create_time()})
        )
        tmp.replace(entry)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return entry


def sweep_stale_runs(folder: Path) -> int:
    """Kill the processes of runs whose harness is dead, and forget those runs; how many
    processes were killed. The watchdog normally does this the moment the harness dies;
    this catches what it could not (it was killed too, or the machine was out of memory)."""
    killed = 0
    for entry in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(entry.read_text())
            run_id, pid, started = str(data["run_id"]), int(data["harness"]), float(data["started"])
        except FileNotFoundError:
            continue  # its harness just finished
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)  # not ours to read: written atomically, so junk
            continue
        if _alive(pid, started):
            continue
        killed += watchdog.kill(watchdog.LaunchProcesses(run_id))
        entry.unlink(missing_ok=True)
    return killed


def _alive(pid: int, started: float) -> bool:
    try:
        proc = psutil.Process(pid)
        same = abs(float(proc.create_time()) - started) < 0.05
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _combined_code(codes: list[int | None]) -> int | None:
    """Rank 0's code, unless a rank failed outside the protocol; a rank's own failure code
    wins over the signal that the harness then sent its peers."""
    if not codes:
        return None
    odd = [c for c in codes if c not in (0, 1, 125)]
    own = [c for c in odd if c is not None and c > 0]
    return (own or odd or codes)[0]


def collect_rank_logs(log_dir: Path) -> list[Path]:
    """Per-rank logs as rank<N>.log in the launch's log dir, whatever the launcher wrote:
    torchrun's --log_dir tree, else the "[default<N>]:" prefixes --tee puts in launch.log."""
    tree = log_dir / "torchrun"
    if tree.is_dir():
        for rank_dir in sorted(tree.glob("*/attempt_*/*")):
            if rank_dir.is_dir() and rank_dir.name.isdigit():
                with (log_dir / f"rank{rank_dir.name}.log").open("wb") as out:
                    for stream in ("stdout.log", "stderr.log"):
                        if (rank_dir / stream).is_file():
                            out.write((rank_dir / stream).read_bytes())
        shutil.rmtree(tree, ignore_errors=True)
    elif not list(log_dir.glob("rank*.log")) and (log_dir / "launch.log").is_file():
        ranks: dict[str, list[str]] = {}
        for line in (log_dir / "launch.log").read_text(errors="replace").splitlines():
            if match := _RANK_PREFIX.match(line):
                ranks.setdefault(match.group(1), []).append(line[match.end() :])
        for rank, lines in ranks.items():
            (log_dir / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    return sorted(log_dir.glob("rank*.log"))


_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:")
