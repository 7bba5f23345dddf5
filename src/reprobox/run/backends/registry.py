"""The one registry of back ends: every kind `--backend` may name, the flags that go with it,
and how it is built. The CLI's `--backend` choices and help come from here, and every
concrete back end (the venv, the concurrent venv, the container engine, Slurm) is built here
and nowhere else, so a caller names a kind, never a class, and always gets a back end back.

The back ends are imported inside their builders, so a caller that needs only one (the venv,
on the common path) never imports a container engine's or Slurm's module.

Kubernetes is not a back end: `reprobox k8s` writes an Indexed Job for a person to apply, and
`reprobox collect` judges what its pods wrote (docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from reprobox.core.counts import check_count
from reprobox.core.errors import BadInput
from reprobox.core.settings import Settings
from reprobox.core.spec import MAX_NODES
from reprobox.run.backend import Backend


@dataclass(frozen=True)
class SlurmFlags:
    """What `--backend slurm` takes (each None when not given)."""

    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    container_image: str | None = None
    container_mounts: str | None = None
    nodes: int | None = None  # every launch over this many nodes (default: [launch] nodes)

    def given(self) -> list[str]:
        """The flags given, as a person typed them (`--container-image`)."""
        return _given(self)


@dataclass(frozen=True)
class ContainerFlags:
    """What `--backend container` takes (each None when not given)."""

    engine: str | None = None  # podman | docker (None: whichever works)
    base: str | None = None  # the base image the Dockerfiles build FROM
    memory: str | None = None  # each container's memory bound (None: per rank + /dev/shm)
    no_cache: bool = False  # rebuild every layer of each image once

    def given(self) -> list[str]:
        return _given(self)


def _given(flags: SlurmFlags | ContainerFlags) -> list[str]:
    return ["--" + f.name.replace("_", "-") for f in fields(flags) if getattr(flags, f.name)]


@dataclass(frozen=True)
class BackendFlags:
    """Every flag that says where launches run, whichever kind they go with."""

    workers: int = 1
    slurm: SlurmFlags = field(default_factory=SlurmFlags)
    container: ContainerFlags = field(default_factory=ContainerFlags)
    gpus: int | None = None  # this host's GPUs (None: count them)


@dataclass(frozen=True)
class Kind:
    """One kind of back end: its name on the command line, what it is in words, and how it
    is built from the flags."""

    name: str
    help: str
    build: Callable[[Settings, BackendFlags], Backend]


def _venv(settings: Settings, flags: BackendFlags) -> Backend:
    """The venv back end one launch at a time, or with a runner process per launch for
    `workers` > 1 (launches from several threads at once)."""
    if flags.workers > 1:
        # start-up cost: a back end loads when chosen only
        from reprobox.run.backends.detached import DetachedBackend

        return DetachedBackend(settings)
    # start-up cost: a back end loads when chosen only
    from reprobox.run.backends.venv import VenvBackend

    return VenvBackend(settings, gpus=flags.gpus)


def _container(settings: Settings, flags: BackendFlags) -> Backend:
    """Each cell in the image built from its own lock; the engine is found (and answers)
    before anything is built."""
    # start-up cost: the container back end and its engine load when chosen only
    from reprobox.run.backends.container import ContainerBackend
    from reprobox.run.backends.engine import find_engine

    given = flags.container
    engine = find_engine(given.engine or settings.engine)
    return ContainerBackend(
        settings, engine, base=given.base, no_cache=given.no_cache, memory=given.memory
    )


def _slurm(settings: Settings, flags: BackendFlags) -> Backend:
    """Slurm, checked before anything runs (its client tools, its controller, the
    partition)."""
    given = flags.slurm
    if given.nodes is not None and not 1 <= given.nodes <= MAX_NODES:
        raise BadInput(f"--nodes {given.nodes}: from 1 to {MAX_NODES}")
    # start-up cost: a back end loads when chosen only
    from reprobox.run.backends.slurm import SlurmBackend

    backend = SlurmBackend(
        settings, partition=given.partition, gres=given.gres, time=given.time,
        container_image=given.container_image, container_mounts=given.container_mounts,
        nodes=given.nodes,
    )  # fmt: skip
    backend.check()
    return backend


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in [
        Kind("venv", "this machine, in the venv built from each lock (default)", _venv),
        Kind(
            "container",
            "this machine, in the image built from each lock (podman or docker; rebuilt only "
            "when the lock, Dockerfile or repro files change)",
            _container,
        ),
        Kind(
            "slurm",
            "one batch job per launch, one array job for a run of several (the results "
            "folder and cache must be on a file system the nodes share)",
            _slurm,
        ),
    ]
}
NAMES = tuple(KINDS)


def help_text() -> str:
    """What `--backend` says of its choices, from the registry."""
    return "where launches run: " + "; ".join(f"{k.name}: {k.help}" for k in KINDS.values())


def make_backend(kind: str, settings: Settings, flags: BackendFlags = BackendFlags()) -> Backend:
    """The back end of `kind`, checked before anything runs. A kind that is not one, or a
    flag that goes with another kind, is bad input; no kind at all is a caller's bug (None
    never stands for a default here)."""
    if not isinstance(kind, str):
        raise TypeError(f"a back end kind, not {kind!r}")
    check_count("--workers", flags.workers)
    if kind not in KINDS:
        raise BadInput(f"--backend {kind}: want one of {', '.join(NAMES)}")
    for owner, given in (("slurm", flags.slurm.given()), ("container", flags.container.given())):
        if given and kind != owner:
            raise BadInput(f"{given[0]} goes with --backend {owner}")
    return KINDS[kind].build(settings, flags)
