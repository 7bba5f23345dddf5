"""The seam between the pipeline and where a launch runs (after JAX-Toolbox triage's
container interface): a back end prepares an environment for a lock and launches a
request in it; the pipeline does everything else (locks, preflight, batching, judging,
recording), so every back end gets all of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from reprobox.core.cells import Cell
from reprobox.core.judge import Launched
from reprobox.core.spec import LaunchSection, Repro
from reprobox.envs.torch_source import HostTorch

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


class Handle(Protocol):
    """What a back end prepared (a venv, an image), as the pipeline reads it: the host's
    torch it imports with REPROBOX_TORCH_SOURCE=host (None: it runs its own torch), and
    the host flavour of the lock it installed (None: the lock itself)."""

    @property
    def host_torch(self) -> HostTorch | None: ...

    @property
    def host_lock(self) -> Path | None: ...


@dataclass(frozen=True)
class Prepared:
    """An environment (or image) ready to launch in."""

    key: str  # cells with equal keys and launch settings may share one launch
    lock: Path
    lock_hash: str
    runner: str  # "venv", or the engine and image
    env_s: float
    handle: Handle  # the back end's own (a venv, an image)
    torch_source: str = ""  # where torch came from, in words without local paths
    image: str = ""  # a container's image digest (sha256:...), which the record names
    # facts of the launch's machine the back end knows better than the host (run/machine.py:
    # a container's /dev/shm is its --shm-size, not the host's)
    machine: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NoHandle:
    """The handle of a back end with nothing of its own to hand on (test fakes)."""

    host_torch: HostTorch | None = None
    host_lock: Path | None = None


class Backend(Protocol):
    """Where launches run: a local venv, a container engine, a cluster scheduler. What a
    back end can do beyond this (many launches as one unit, launches from several threads,
    cancellation) is declared in run/capabilities.py and checked there alone."""

    name: str

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        """Make the environment for `lock` ready (raises EnvError and friends)."""
        ...

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The command line of the launch as a person would type it (for the record)."""
        ...

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The names of the variables the launched processes start with (for the record;
        never their values)."""
        ...

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        """Run the request to its end or timeout; on KeyboardInterrupt stop everything it
        started and re-raise."""
        ...


def plan_text(request: LaunchRequest, result_paths: list[str]) -> str:
    """The batch plan file (repros/README.md, "Batching"), with each case's result path as
    the launched processes see it (a back end writes it where its launch reads it)."""
    cases = [
        {"args": list(case.args), "result": path}
        for case, path in zip(request.cases, result_paths, strict=True)
    ]
    return json.dumps({"cases": cases}, indent=2) + "\n"
