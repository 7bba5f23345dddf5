"""The one way the harness signals a process group it started: only while that group is
provably the one it started.

A process started with `start_new_session=True` leads a group (and a session) whose id is
its pid. Until the harness reaps it (`wait`, `poll`), its pid, alive or a zombie, cannot be
given to another process, so the group is still the one it started. Once it is reaped, the
number is free: on a machine that other jobs share (pid_max 32768) it may already lead
someone else's group, and `killpg` would kill that. So a reaped leader's group gets nothing;
what it left behind is found by identity (pid and start time) by the launch's clean-up.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def signal_group(proc: subprocess.Popen[Any], sig: signal.Signals) -> bool:
    """Send `sig` to the group `proc` leads, unless `proc` was reaped (its id may now be
    another's); whether it was sent. `returncode` is read, never `poll()`ed: polling would
    reap the process and free its id between the check and the signal."""
    if proc.returncode is not None:
        return False
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
