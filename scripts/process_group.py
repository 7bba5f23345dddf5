"""Runs a command in a process group of its own and passes a signal to this script (a
cancelled CI job, a `kill` of make) to the whole group as SIGINT, which pytest answers by
tearing its fixtures down (a test's Slurm daemons included); whatever is still in the group
30 s later is killed. `make test` runs the suite through it: a TERM used to stop make and
nox alone, and pytest's workers and a test's Slurm cluster ran on for 20 minutes.

The group is signalled only through `reprobox.core.processes.signal_group`, and its leader
is not reaped until the end (its exit is read with WNOWAIT), so the group's id cannot pass
to another process while this script may still signal it: the shell script this replaces
polled and killed the group by number after its leader was reaped.

    python scripts/process_group.py COMMAND [ARG ...]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from reprobox.core.processes import signal_group

GRACE_S = 30.0  # from SIGINT to SIGKILL
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def _members(pgid: int) -> bool:
    """Whether a live (not zombie) process is still in the group."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def _exited(pid: int) -> bool:
    """Whether the leader has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: process_group.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    received: list[int] = []
    for sig in CODES:
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    proc = subprocess.Popen(argv, start_new_session=True)
    while not received and not _exited(proc.pid):
        time.sleep(0.1)
    if received:
        for sig in CODES:
            signal.signal(sig, signal.SIG_IGN)
        signal_group(proc, signal.SIGINT)
        deadline = time.monotonic() + GRACE_S
        while _members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _members(proc.pid):
            signal_group(proc, signal.SIGKILL)
        proc.wait()
        return CODES[signal.Signals(received[0])]
    code = proc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
