"""The seam between the pipeline and where a launch runs (after JAX-Toolbox triage's
container interface): a back end prepares an environment for a lock and launches a
request in it; the pipeline does everything else (locks, preflight, batching, judging,
recording), so every back end gets all of it.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from reprobox.core.cells import Cell
from reprobox.core.errors import ReproboxError
from reprobox.core.judge import Launched
from reprobox.core.spec import LaunchSection, Repro

RESULT_FILE = "result.json"
PLAN_FILE = "plan.json"
PREFLIGHT_DIR = "preflight"  # a container's preflight writes into a folder of its own
PREFLIGHT_LOG = "preflight.log"  # a venv preflight's output, beside the launch's


@dataclass(frozen=True)
class Case:
    """One cell's part of a launch: its script arguments and where its result goes."""

    cell: Cell
    args: tuple[str, ...]
    run_dir: Path

    @property
    def result(self) -> Path:
        return self.run_dir / RESULT_FILE


@dataclass(frozen=True)
class LaunchRequest:
    """What to launch, independent of where: one case, or a batch sharing one launch."""

    repro: Repro
    launch: LaunchSection  # [launch] with the variant's overrides
    cases: tuple[Case, ...]
    timeout: float
    preflight: tuple[str, ...] | None = None  # set: one plain process with these extra args
    echo: TextIO | None = None  # stream the launcher's output here

    @property
    def lead(self) -> Case:
        return self.cases[0]

    @property
    def log_dir(self) -> Path:
        """Where the launch's logs go: the lead case's folder (a preflight's own subfolder)."""
        base = self.lead.run_dir
        return base / PREFLIGHT_DIR if self.preflight is not None else base


@dataclass(frozen=True)
class Prepared:
    """An environment (or image) ready to launch in."""

    key: str  # cells with equal keys and launch settings may share one launch
    lock: Path
    lock_hash: str
    runner: str  # "venv", or the engine and image
    env_s: float
    torch_source: str = ""  # where torch came from, in words without local paths
    handle: Any = None  # the back end's own (a venv, an image)


class Backend(Protocol):
    """Where launches run: a local venv, a container engine, a cluster scheduler."""

    name: str

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        """Make the environment for `lock` ready (raises EnvError and friends)."""
        ...

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The command line of the launch as a person would type it (for the record)."""
        ...

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        """Run the request to its end or timeout; on KeyboardInterrupt stop everything it
        started and re-raise."""
        ...


class LaunchesMany(Protocol):
    """A back end that can hand several launches to its scheduler as one unit (Slurm: one
    array job), cheaper to submit and to cancel than one by one. Optional: the pipeline
    uses `launch_many` for a run of several launches when the back end has it, else it
    calls `launch` once per launch."""

    def launch_many(
        self, launches: Sequence[tuple[Prepared, LaunchRequest]], workers: int
    ) -> Generator[tuple[int, Launched | ReproboxError], None, None]:
        """Start every launch, at most `workers` running at once, and yield (index, how it
        ended: Launched, or the ReproboxError that ended it) as each ends, in the order they
        end. A failure of the whole submission raises; so does an interrupt. Closing the
        iterator early (or an exception) stops every launch still running or queued."""
        ...
