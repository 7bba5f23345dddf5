"""Signals to the harness: each becomes an exception once, and no clean-up is cut short.

SIGINT raises KeyboardInterrupt and SIGTERM / SIGHUP raise `Terminated` (a KeyboardInterrupt
subclass), so every path that cleans up after Ctrl-C (ranks killed, records marked
interrupted) runs for a cancelled CI job, `timeout(1)` or a closed terminal too.

Only the first signal raises. nox sends SIGTERM 0.3 s after SIGINT and a user presses Ctrl-C
twice; an exception raised in the middle of clean-up would abort it and leave ranks running
or a record unsaved. A later signal instead makes the clean-up `urgent()`: whatever waits for
a grace period stops waiting and kills at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from reprobox.core.errors import Terminated

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _State:
    raised = False  # an interrupt is unwinding the harness
    urgent = False  # a signal arrived while it was (or while clean-up ran)
    shields = 0  # clean-ups in progress
    pending: int | None = None  # the first signal that arrived inside a clean-up


_state = _State()


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The exception a signal is raised as."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state.raised or _state.shields:
        _state.urgent = True
        if _state.pending is None and not _state.raised:
            _state.pending = signum
        return
    _state.raised = True
    raise interrupt_for(signum)


@contextmanager
def handled() -> Iterator[None]:
    """Route SIGINT, SIGTERM and SIGHUP through this module while the block runs (the CLI
    wraps a whole command in it, its error handling included), then put back what was."""
    _reset()
    previous = {sig: signal.signal(sig, _handler) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _reset()


def _reset() -> None:
    _state.raised = _state.urgent = False
    _state.pending = None


def urgent() -> bool:
    """Whether a signal arrived during clean-up: stop waiting for graces, kill now."""
    return _state.urgent


@contextmanager
def shielded(raise_pending: bool) -> Iterator[None]:
    """Clean-up that no signal may interrupt: a signal arriving inside only makes it
    `urgent()`. With `raise_pending` (no interrupt already on its way), the first such
    signal is raised when the clean-up is done, so a timeout's clean-up (or a failed
    start's) still ends in the interrupt the user asked for."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _handler) for sig in HANDLED}
    _state.shields += 1
    try:
        yield
    finally:
        _state.shields -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pending = _state.pending if not _state.shields else None
        if not _state.shields:
            _state.pending = None
            if not _state.raised:
                _state.urgent = False
        if pending is not None and raise_pending:
            # Raised here, not by the handler: later signals must still find it unwinding.
            _state.raised = signal.getsignal(pending) is _handler
            raise interrupt_for(pending)
