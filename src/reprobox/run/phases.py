"""What a run is doing now, as typed events: resolving a lock, preparing and installing an
environment, launching, running, scrubbing the logs, judging. The pipeline and its hooks
emit them; one callback (the CLI's) says them to a person or a CI log. `run` never draws: it
knows no terminal.

The callback is set for a run with `reporting(on_phase)`; a hook deep in a back end (the
environment install, the launcher) calls `emit` without being handed it. The sink lives in a
context variable: a launch on another thread sees it through `in_context`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")


class PhaseKind(StrEnum):
    RESOLVING = "resolving"  # the cell's lock (committed, cached, or resolved now)
    PREPARING = "preparing"  # the back end makes the environment ready (a venv, an image)
    INSTALLING = "installing"  # an environment that is not ready yet
    LAUNCHING = "launching"  # the launcher (or the preflight) is being started
    RUNNING = "running"  # its processes are up
    SCRUBBING = "scrubbing"  # the launch ended: its logs are capped and scrubbed of secrets
    JUDGING = "judging"  # the launch ended: exit codes and result files are read


@dataclass(frozen=True)
class Phase:
    """One phase of one launch or cell: `kind`, the cells it is for, a few words of detail
    (`6 packages`, `2 processes started`)."""

    kind: PhaseKind
    cells: tuple[str, ...] = ()
    detail: str = ""

    def text(self) -> str:
        """`installing 6 packages`, `running (2 processes started)`, `scrubbing 2 logs
        (8.0 MiB)`."""
        if not self.detail:
            return self.kind.value
        if self.kind in (
            PhaseKind.RESOLVING,
            PhaseKind.PREPARING,
            PhaseKind.INSTALLING,
            PhaseKind.SCRUBBING,
        ):
            return f"{self.kind.value} {self.detail}"
        return f"{self.kind.value} ({self.detail})"


OnPhase = Callable[[Phase], None]
_SINK: contextvars.ContextVar[OnPhase | None] = contextvars.ContextVar("phase_sink", default=None)
_CELLS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("phase_cells", default=())


@contextmanager
def reporting(on_phase: OnPhase | None) -> Iterator[None]:
    """Send the phases emitted in this block (and its `in_context` threads) to `on_phase`."""
    token = _SINK.set(on_phase)
    try:
        yield
    finally:
        _SINK.reset(token)


@contextmanager
def for_cells(labels: Sequence[str]) -> Iterator[None]:
    """Phases emitted in this block without cells of their own are for `labels`."""
    token = _CELLS.set(tuple(labels))
    try:
        yield
    finally:
        _CELLS.reset(token)


def emit(kind: PhaseKind, detail: str = "", cells: Sequence[str] | None = None) -> None:
    """Tell the run's callback (if any) that a phase began. The callback must not raise:
    its exception would end the run (the CLI's only prints)."""
    sink = _SINK.get()
    if sink is not None:
        sink(Phase(kind, tuple(cells) if cells is not None else _CELLS.get(), detail))


def in_context(function: Callable[..., T]) -> Callable[..., T]:
    """`function` bound to this thread's context (for a pool's worker threads: each call
    runs in its own copy, so calls may run at once)."""
    context = contextvars.copy_context()

    def bound(*args: object) -> T:
        return context.copy().run(function, *args)

    return bound
