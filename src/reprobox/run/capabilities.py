"""What a back end can do beyond the `Backend` protocol, declared as small protocols and
checked here alone, so the pipeline and the prober never probe a back end with getattr.

- `LaunchesMany`: several launches handed to the scheduler as one unit (Slurm: one array
  job), cheaper to submit and to cancel than one by one.
- `LaunchesConcurrently`: `launch` may be called from several threads at once (each launch
  apart: its own runner process, port, process group and run folder), and `cancel_all`
  stops every launch still running when an interrupt reaches the harness.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Literal, Protocol, runtime_checkable

from reprobox.core.errors import ReproboxError
from reprobox.core.judge import Launched
from reprobox.run.backend import Backend, LaunchRequest, Prepared


@runtime_checkable
class LaunchesMany(Backend, Protocol):
    """A back end that takes a run of several launches at once (`launch_many`); the
    pipeline then calls it instead of `launch` once per launch."""

    def launch_many(
        self, launches: Sequence[tuple[Prepared, LaunchRequest]], workers: int
    ) -> Generator[tuple[int, Launched | ReproboxError], None, None]:
        """Start every launch, at most `workers` running at once, and yield (index, how it
        ended: Launched, or the ReproboxError that ended it) as each ends, in the order they
        end. A failure of the whole submission raises; so does an interrupt. Closing the
        iterator early (or an exception) stops every launch still running or queued."""
        ...


@runtime_checkable
class LaunchesConcurrently(Backend, Protocol):
    """A back end whose `launch` is safe from several threads at once (`--workers K`)."""

    concurrent: Literal[True]

    def cancel_all(self) -> None:
        """Stop every launch this back end runs (an interrupt reached the harness)."""
        ...


def many(backend: Backend) -> LaunchesMany | None:
    """The back end as one that launches many at once, or None."""
    return backend if isinstance(backend, LaunchesMany) else None


def concurrent(backend: Backend) -> LaunchesConcurrently | None:
    """The back end as one that may launch from several threads, or None. A back end that
    declares `concurrent = False` is not one, whatever else it has."""
    if isinstance(backend, LaunchesConcurrently) and backend.concurrent is True:
        return backend
    return None


def canceller(backend: Backend) -> Callable[[], None] | None:
    """How to stop every launch of the back end at once (an interrupt), or None when each
    launch stops itself (one at a time, in this process)."""
    able = concurrent(backend)
    return able.cancel_all if able is not None else None
