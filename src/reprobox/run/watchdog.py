"""A launch's watchdog: kills what the launch left when the harness itself dies.

A parent-death signal reaches only the processes the harness starts itself (it stops them:
see `kill`); torchrun's workers, a rank's children and daemons do not inherit it. So every
launch starts this small process with a pipe from the harness on its stdin, in its own
session (a Ctrl-C in the terminal does not reach it). The harness writes what it learns about
the launch: its process group, the processes it saw in the launch's tree (pid and start
time), their sessions and groups (each with its leader's start time: see `LaunchProcesses`).
"done" ends the watch quietly. When the pipe closes without it (the harness got kill -9,
the OOM killer, nox's SIGKILL half a second after Ctrl-C), the watchdog kills all of that,
every process carrying the launch's run id, and all their descendants, then removes the
run's entry from the registry of live runs.

A container run (`podman run`) is watched the same way (`Watcher`): the harness also writes
"container ENGINE NAME", and a watchdog whose pipe closes removes that container
(`podman rm -f -t 0 NAME`), which `podman run` would otherwise leave running for ever.

Run as `python -m reprobox.run.watchdog RUN_ID [REGISTRY_FILE]`; it needs only psutil.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil

RUN_ID_ENV = "REPROBOX_RUN_ID"
# Start times as two psutil calls see them may differ by a clock tick.
_SAME_START_S = 0.05


@dataclass
class LaunchProcesses:
    """What is known of one launch's processes: enough to find every one of them again, and
    never another's.

    A group or session is known by its id and its leader's start time: it counts only while
    its leader is that very process. Once the leader is gone the id may be recycled (pid_max
    32768 on a machine other jobs share) for someone else's group, so a process in it must
    prove itself another way: its own pid and start time, the run id in its environment, or
    descent from a process that did (`kill`)."""

    run_id: str
    groups: dict[int, float] = field(default_factory=dict)  # group id -> its leader's start
    pids: dict[int, float] = field(default_factory=dict)  # pid -> start time
    sessions: dict[int, float] = field(default_factory=dict)  # session id -> leader's start
    containers: list[tuple[str, str]] = field(default_factory=list)  # (engine, name)

    def belongs(self, proc: psutil.Process, started: float) -> bool:
        """Whether `proc` (started at `started`) is one of the launch's processes."""
        known = self.pids.get(proc.pid)
        if known is not None and abs(known - started) < _SAME_START_S:
            return True
        try:
            group, session = os.getpgid(proc.pid), os.getsid(proc.pid)
        except OSError:
            return False
        if _led_by(group, self.groups) or _led_by(session, self.sessions):
            return True
        try:
            return bool(proc.environ().get(RUN_ID_ENV) == self.run_id)
        except (psutil.Error, OSError):
            return False


def _led_by(ident: int, leaders: dict[int, float]) -> bool:
    """Whether group or session `ident` is one the launch knows, still led by the process
    that started it (same pid, same start time)."""
    known = leaders.get(ident)
    if known is None:
        return False
    started = start_time(ident)
    return started is not None and abs(started - known) < _SAME_START_S


def start_time(pid: int) -> float | None:
    """When `pid` started (None: gone): with the pid, a process's identity."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def send(pid: int, started: float, sig: int) -> bool:
    """Send `sig` to process `pid` only if it is the one that started at `started`; whether
    it was sent. A pidfd pins the process between the check and the signal, so a pid freed
    and reused meanwhile is never hit (without pidfds: psutil's own check, then kill)."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, PermissionError):
        return False
    except (AttributeError, OSError):
        return _send_checked(pid, started, sig)
    try:
        now = start_time(pid)
        if now is None or abs(now - started) >= _SAME_START_S:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _send_checked(pid: int, started: float, sig: int) -> bool:
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) >= _SAME_START_S:
            return False
        proc.send_signal(sig)  # psutil checks again that the pid was not reused
        return True
    except psutil.Error:
        return False


def kill(launch: LaunchProcesses, spare: Sequence[int] = ()) -> int:
    """SIGKILL every process of the launch and all their descendants (never this process
    or `spare`); how many were killed. Each is killed by its identity (`send`), as seen when
    it was found to belong.

    Descendants count because a daemon that left the group and the session and cleared its
    environment is still the child of a rank: every launched process is a child subreaper,
    and when the harness dies its ranks are stopped, not killed, so they still hold their
    orphans when the watchdog looks. Passes repeat until one finds nothing: a process that
    forked while the last pass ran is caught by the next."""
    spared = {os.getpid(), *spare}
    # by identity: a process still dying (killed, not yet a zombie) when the next pass looks
    # is sent the signal again but counted once
    killed: set[tuple[int, float]] = set()
    for _ in range(5):
        children: dict[int, list[psutil.Process]] = {}
        doomed: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["ppid", "create_time", "status"]):
            if proc.pid in spared or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            children.setdefault(proc.info["ppid"], []).append(proc)
            started = proc.info["create_time"]
            if started is not None and launch.belongs(proc, started):
                doomed[proc.pid] = proc
        stack = list(doomed)
        while stack:
            for child in children.get(stack.pop(), []):
                if child.pid not in doomed:
                    doomed[child.pid] = child
                    stack.append(child.pid)
        found = 0
        for proc in doomed.values():
            started = proc.info.get("create_time")
            if started is not None and send(proc.pid, started, signal.SIGKILL):
                found += 1
                killed.add((proc.pid, started))
        if not found:
            break
        time.sleep(0.05)
    return len(killed)


# Engines whose containers a watchdog may remove, and how (quiet when already gone).
_REMOVE = {
    "podman": ["rm", "--force", "--time", "0", "--ignore"],
    "docker": ["rm", "--force"],
}
REMOVE_TIMEOUT_S = 60.0


def remove_containers(containers: Sequence[tuple[str, str]]) -> None:
    """Remove the launch's containers (stopped at once: `-t 0`), engine by engine."""
    for engine, name in containers:
        if engine not in _REMOVE or not name.startswith("reprobox-"):
            continue  # only what the harness itself named
        try:
            subprocess.run([engine, *_REMOVE[engine], name], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue


class Watcher:
    """A watchdog for what the harness starts outside the launcher (a container run): it
    removes the containers and kills the processes it was told of if the harness dies
    before `done()`. Best effort: with no watchdog the harness's own clean-up still runs."""

    def __init__(self, run_id: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != RUN_ID_ENV}
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "reprobox.run.watchdog", run_id],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal is not for it
            )  # fmt: skip
        except OSError:
            self._proc = None

    def container(self, engine: str, name: str) -> None:
        """Remove this container if the harness dies (say so before starting it)."""
        self._send(f"container {engine} {name}")

    def process(self, pid: int) -> None:
        """Kill this process (and its descendants) if the harness dies."""
        try:
            self._send(f"pid {pid} {psutil.Process(pid).create_time()!r}")
        except psutil.Error:
            pass  # already gone

    def done(self) -> None:
        """The run is over and cleaned up: the watchdog exits quietly."""
        self._send("done")
        if self._proc is not None and self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(f"{line}\n".encode())
            self._proc.stdin.flush()
        except OSError:
            self._proc = None


class _Stop(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def main(argv: Sequence[str]) -> int:
    """Watch one launch until "done" or until the harness's end of the pipe closes."""
    if len(argv) not in (2, 3):
        print("usage: python -m reprobox.run.watchdog RUN_ID [REGISTRY_FILE]", file=sys.stderr)
        return 2
    launch = LaunchProcesses(run_id=argv[1])
    registry = Path(argv[2]) if len(argv) == 3 else None
    # Ctrl-C and a closed terminal are the harness's to handle; SIGTERM means "now".
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    done = False
    try:
        for line in sys.stdin.buffer:
            kind, _, rest = line.decode(errors="replace").strip().partition(" ")
            try:
                if kind == "done":
                    done = True
                    break
                if kind in ("group", "session"):  # an id with no leader's start: never used
                    ident, started = rest.split()
                    leaders = launch.groups if kind == "group" else launch.sessions
                    leaders[int(ident)] = float(started)
                elif kind == "pid":
                    pid, started = rest.split()
                    launch.pids[int(pid)] = float(started)
                elif kind == "container":
                    engine, name = rest.split()
                    launch.containers.append((engine, name))
            except ValueError:
                continue  # a line torn by the harness's death
    except _Stop:
        pass
    if not done:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the job first
        remove_containers(launch.containers)  # first: a container outlives its client
        kill(launch)
        if registry is not None:
            registry.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
