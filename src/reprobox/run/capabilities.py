"""What a back end can do beyond the `Backend` protocol, declared as small protocols and
checked here alone, so the pipeline and the prober never probe a back end with getattr.

- `LaunchesMany`: several launches handed to the scheduler as one unit (Slurm: one array
  job), cheaper to submit and to cancel than one by one.
- `LaunchesConcurrently`: `launch` may be called from several threads at once (each launch
  apart: its own runner process, port, process group and run folder), and `cancel_all`
  stops every launch still running when an interrupt reaches the harness.
- `BuildsImages`: `prepare` builds an image (content-addressed by its lock, Dockerfile and
  repro files), which `push` sends to a registry; `built` lists what it built or found.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Literal, Protocol, runtime_checkable

from reprobox.core.errors import ReproboxError
from reprobox.core.judge import Launched
from reprobox.run.backend import Backend, LaunchRequest, Prepared
from reprobox.run.pushes import Pushed


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


@runtime_checkable
class BuildsImages(Backend, Protocol):
    """A back end whose environments are images an engine builds and can push."""

    built: list[tuple[str, bool, float]]  # (tag, built now rather than found, seconds)

    @property
    def engine_name(self) -> str: ...

    def push(self, prepared: Prepared, registry: str) -> Pushed:
        """Push the prepared image to `registry` and record the digest it got."""
        ...


def images(backend: Backend) -> BuildsImages | None:
    """The back end as one that builds images, or None."""
    return backend if isinstance(backend, BuildsImages) else None


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
