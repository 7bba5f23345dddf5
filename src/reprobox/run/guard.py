"""What makes sure one launch leaves nothing behind, whatever happens to the harness: the
registry of live runs (swept when their harness died), the watchdog, the tracked process
tree (this process a child subreaper, so orphans are re-parented to it and seen)."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from reprobox.run import interrupts, watchdog

RUN_ID_ENV = watchdog.RUN_ID_ENV
# How often the launch's process tree is walked for new processes.
TRACK_EVERY_S = 0.25

# prctl(2) options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def prctl(option: int, value: int) -> bool:
    return _LIBC is not None and _LIBC.prctl(option, value, 0, 0, 0) == 0


def _subreaper() -> int:
    """Whether this process is a child subreaper now (0 or 1)."""
    flag = ctypes.c_int(0)
    if _LIBC is not None:
        _LIBC.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value


class Guard:
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
        prctl(PR_SET_CHILD_SUBREAPER, 1)

    @property
    def watched(self) -> bool:
        """Whether a watchdog guards the launch (it started and is still there)."""
        return self._watchdog is not None and self._watchdog.poll() is None

    def watch(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """The launch has started: tell the watchdog its groups and sessions (each process
        the harness started leads one of each, known by the leader's start time) and its
        processes. None is reaped yet, so each is there to ask, a zombie at worst."""
        for proc in procs:
            started = _started(proc.pid)
            if started is None:
                continue  # cannot be while unreaped; never an id without its leader
            self._lead("group", proc.pid, started)
            self._lead("session", proc.pid, started)
            self._add(proc.pid, started)

    def _lead(self, kind: str, ident: int, started: float | None) -> None:
        """Remember a group or session (`kind`) of the launch with its leader's start time,
        and tell the watchdog; never the harness's own, never one whose leader is gone."""
        leaders = self.launch.groups if kind == "group" else self.launch.sessions
        if started is None or ident in self._own or ident in leaders:
            return
        leaders[ident] = started
        self._send(f"{kind} {ident} {started!r}")

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
        # Their leaders as they are now: `pid` holds both ids, so whoever has the leader's
        # pid is that leader; a group or session whose leader is gone is not named.
        self._lead("group", group, _started(group))
        self._lead("session", session, _started(session))

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
            prctl(PR_SET_CHILD_SUBREAPER, self._was_subreaper)
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
        prctl(PR_SET_CHILD_SUBREAPER, self._was_subreaper)
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


_started = watchdog.start_time  # to tell a process from a later one with its pid


_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _register(run_id: str, registry: Path) -> Path | None:
    """Note the run as live, owned by this process on this host; None when the cache folder
    is not writable (a full disk must not stop the launch: the watchdog still guards it).

    The entry is named by host too: a cache on a shared file system holds the entries of
    every node, and the nodes of one multi-node launch share its run id."""
    me = psutil.Process()
    host = socket.gethostname()
    entry = registry / f"{run_id}@{host}.json"
    tmp = entry.with_name(f".{entry.name}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"run_id": run_id, "harness": me.pid,
                                   "started": me.create_time(), "host": host}))  # fmt: skip
        tmp.replace(entry)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return entry


def sweep_stale_runs(folder: Path) -> int:
    """Kill the processes of runs whose harness is dead, and forget those runs; how many
    processes were killed. The watchdog normally does this the moment the harness dies;
    this catches what it could not (it was killed too, or the machine was out of memory).

    Only this host's entries are judged: another node's harness is not a process here, and
    its run's processes here (a multi-node launch) are not this sweep's to kill."""
    killed = 0
    host = socket.gethostname()
    for entry in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(entry.read_text())
            run_id, pid, started = str(data["run_id"]), int(data["harness"]), float(data["started"])
            owner = str(data.get("host", host))  # entries written before hosts were named
        except FileNotFoundError:
            continue  # its harness just finished
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            entry.unlink(missing_ok=True)  # not ours to read: written atomically, so junk
            continue
        if owner != host or _alive(pid, started):
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
