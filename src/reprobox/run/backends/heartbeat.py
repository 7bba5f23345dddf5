"""The beat both ways between the harness and a Slurm launch (why: `slurmjob`'s notes): the
runner on the node rewrites `launch-heartbeat` every HEARTBEAT_S while its launch runs and
stops the launch once the harness's `harness-heartbeat` has not changed for
HARNESS_LOST_AFTER_S; the harness's `HarnessBeat` writes that file. Files are rewritten in
place and read by content, never by time stamps. Its own module so a single-node job
(`slurmjob`) and each node of a launch over nodes (`slurm_nodes`) run the same runner.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from reprobox.run.backends import detached

HEARTBEAT_NAME = "launch-heartbeat"
HEARTBEAT_S = 5.0  # how often the runner on the node beats
HARNESS_NAME = "harness-heartbeat"  # the harness's beat, in the launch's run folder
HARNESS_LOST_AFTER_S = 30.0  # no harness beat this long: the runner stops its launch


def write_beat(path: Path, count: int) -> None:
    """Beat once: `count` written over the file."""
    try:
        with path.open("w") as handle:  # in place, not renamed: see `slurmjob`'s notes
            handle.write(f"{count}\n")
    except OSError:
        pass  # a full or unreachable disk: the other side sees the beat stop, as it should


def _beat(path: Path, stop: threading.Event, harness: Path | None) -> None:
    """Beat until stopped; stop the launch (SIGTERM to this runner) once the harness's beat
    has not changed for HARNESS_LOST_AFTER_S (by content: the clocks differ). A harness
    beat never seen (no file) is never judged."""
    count = 0
    seen: str | None = None
    changed_at = time.monotonic()
    while not stop.is_set():
        count += 1
        write_beat(path, count)
        if harness is not None:
            now, beat = time.monotonic(), read_beat(harness)
            if beat is not None and beat != seen:
                seen, changed_at = beat, now
            elif seen is not None and now - changed_at > HARNESS_LOST_AFTER_S:
                print(
                    f"reprobox: error: the harness stopped beating {now - changed_at:.0f}s ago "
                    "(killed, or its host lost): stopping the launch",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGTERM)  # this very process: the runner
                return
        stop.wait(HEARTBEAT_S)


def run_with_heartbeat(
    plan_file: Path, outcome_file: Path, beat: Path, harness: Path | None = None
) -> int:
    """Run one plan as the detached runner does, beating until its outcome is written, and
    stopping it if the harness's beat (`harness`) stops."""
    stop = threading.Event()
    thread = threading.Thread(target=_beat, args=(beat, stop, harness), daemon=True)
    thread.start()
    try:
        return detached.run_plan_file(plan_file, outcome_file)
    finally:
        stop.set()


class HarnessBeat:
    """The harness's side of the beat: a thread that rewrites `harness-heartbeat` in each
    folder it is given, every HEARTBEAT_S, whatever the watch is doing (a slow scontrol must
    not read as a dead harness). It dies with the harness, which is the point."""

    def __init__(self) -> None:
        self._folders: dict[Path, int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._count = 0

    def add(self, folder: Path) -> None:
        """Beat in `folder` from now on (a first beat at once: before its job is submitted)."""
        with self._lock:
            self._folders[folder] = self._folders.get(folder, 0) + 1
            self._count += 1
            count = self._count
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="harness-beat")  # fmt: skip
                self._thread.start()
        write_beat(folder / HARNESS_NAME, count)

    def remove(self, folder: Path) -> None:
        """Stop beating in `folder` (its job was read back)."""
        with self._lock:
            left = self._folders.get(folder, 0) - 1
            if left > 0:
                self._folders[folder] = left
            else:
                self._folders.pop(folder, None)

    def _run(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                self._count += 1
                count, folders = self._count, list(self._folders)
            for folder in folders:
                write_beat(folder / HARNESS_NAME, count)


def read_beat(path: Path) -> str | None:
    """A beat file's content (None: not there, or unreadable for now)."""
    try:
        return path.read_text()
    except OSError:
        return None
