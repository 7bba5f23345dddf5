"""Back ends: where a launch runs (see run/backend.py for the interface), and the one factory
that chooses one (`make_backend`): callers name a kind, never a class, and always get a back
end back (no kind is the local venv).

The back ends are imported inside the factory, so a caller that needs only one (the venv, on
the common path) never imports a container engine's or Slurm's module.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from reprobox.core.counts import check_count
from reprobox.core.errors import BadInput
from reprobox.core.settings import Settings
from reprobox.core.spec import MAX_NODES
from reprobox.run.backend import Backend

KINDS = ("venv", "slurm")


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
        return ["--" + f.name.replace("_", "-") for f in fields(self) if getattr(self, f.name)]


def make_backend(
    kind: str | None,
    settings: Settings,
    *,
    workers: int = 1,
    slurm: SlurmFlags = SlurmFlags(),
    gpus: int | None = None,
) -> Backend:
    """The back end of `kind` (None: "venv"): the venv back end one launch at a time, a
    runner process per launch for `workers` > 1 (launches from several threads at once), or
    Slurm, checked before anything runs (its client tools, its controller, the partition).
    A flag that does not go with the kind, or a kind that is not one, is bad input."""
    kind = kind or "venv"
    check_count("--workers", workers)
    if kind not in KINDS:
        raise BadInput(f"--backend {kind}: want one of {', '.join(KINDS)}")
    if kind != "slurm":
        given = slurm.given()
        if given:
            raise BadInput(f"{given[0]} goes with --backend slurm")
        if workers > 1:
            from reprobox.run.backends.detached import DetachedBackend

            return DetachedBackend(settings)
        from reprobox.run.backends.venv import VenvBackend

        return VenvBackend(settings, gpus=gpus)
    if slurm.nodes is not None and not 1 <= slurm.nodes <= MAX_NODES:
        raise BadInput(f"--nodes {slurm.nodes}: from 1 to {MAX_NODES}")
    from reprobox.run.backends.slurm import SlurmBackend

    backend = SlurmBackend(
        settings, partition=slurm.partition, gres=slurm.gres, time=slurm.time,
        container_image=slurm.container_image, container_mounts=slurm.container_mounts,
        nodes=slurm.nodes,
    )  # fmt: skip
    backend.check()
    return backend
