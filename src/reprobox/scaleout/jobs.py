"""A repro's cells as plain job descriptions for engines outside this machine.

The GitHub Actions matrix and the Kubernetes Indexed Job both start one job per cell; this
module says, for each cell, what to run: the `reprobox run` arguments, and for a container the
launcher command and the script's protocol arguments. Nothing here knows a bug by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from reprobox.core import spec
from reprobox.core.cells import (
    DEFAULT_CELL,
    Cell,
    VersionsInRange,
    default_cells,
    matrix_cells,
    script_args,
)
from reprobox.core.errors import BadInput, ReproboxError
from reprobox.run.layout import container_argv
from reprobox.scaleout import noxview

Which = Literal["default", "matrix", "all"]
GITHUB_MATRIX_LIMIT = 256  # jobs one GitHub Actions matrix may hold


@dataclass(frozen=True)
class JobCell:
    """One cell as a job: enough to run it anywhere and to import its result afterwards."""

    index: int
    repro: str
    variant: str
    label: str
    slug: str
    packages: dict[str, str]
    params: dict[str, str]
    expect: str
    also_ok: list[str]
    platform: str
    run_args: list[str]  # after `reprobox run <repro>` (or `nox -s image -- <repro>`)
    launch: list[str]  # the launcher inside the image, up to and including the script
    args: list[str]  # the script's protocol arguments (repros/README.md)
    env: dict[str, str] = field(default_factory=dict)  # [launch] env
    timeout: float = 0.0
    processes: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def image_launch(repro: spec.Repro, variant: str) -> list[str]:
    """The launcher command inside the repro's image, up to and including the script (each
    pod streams its own output, so no per-rank log folder)."""
    return container_argv(repro, variant, [], rank_logs=False)


def select_cells(
    root: Path,
    name: str,
    which: Which = "all",
    platform: str = "cpu",
    axes: VersionsInRange | None = None,
) -> list[Cell]:
    """The default cells, the matrix cells, or both (a version range needs `axes`)."""
    repro = spec.load(root, name)
    cells: list[Cell] = []
    if which in ("default", "all"):
        cells += default_cells(repro, platform=platform)
    if which in ("matrix", "all"):
        cells += [c.on(platform) for c in matrix_cells(repro, axes)]
    return cells


def job_cells(
    root: Path,
    name: str,
    which: Which = "all",
    platform: str = "cpu",
    axes: VersionsInRange | None = None,
) -> list[JobCell]:
    """Every selected cell of `name` as a job, indexed from 0 in a stable order."""
    repro = spec.load(root, name)
    repro.platform(platform)  # unknown platform: BadInput naming the ones it has
    jobs = []
    for index, cell in enumerate(select_cells(root, name, which, platform, axes)):
        launch = repro.launch(cell.variant)
        jobs.append(
            JobCell(
                index=index,
                **cell.identity(),
                slug=cell.slug,
                platform=platform,
                run_args=cell.run_args(),
                launch=image_launch(repro, cell.variant),
                args=script_args(repro, cell),
                env=dict(launch.env),
                timeout=launch.timeout,
                processes=launch.processes,
            )
        )
    return jobs


def has_gpu_image(root: Path, name: str) -> bool:
    """A repro runs on GPU runners when it declares a gpu platform and has an image."""
    repro = spec.load(root, name)
    return "gpu" in repro.spec.platforms and (root / "images" / name / "Dockerfile").is_file()


def github_matrix(
    root: Path, listed: Iterable[dict[str, Any]], axes: VersionsInRange | None = None
) -> dict[str, Any]:
    """Turn `nox --json -l` output into GitHub Actions job matrices.

    `cpu`: one job per nox session (`nox -s "<session>"`). `gpu`: one job per cell of a repro
    with a GPU image, as arguments for `nox -s image -- <repro> ... --platform gpu --run`, with
    `gpus` (its process count, one GPU each: the runner label `gpu-<gpus>`); a default session
    stands for each default variant. Each is `{"include": [...]}`."""
    cpu, gpu = [], []
    known: dict[str, list[noxview.SessionCell]] = {}
    for entry in listed:
        call_spec = entry.get("call_spec") or {}
        name = call_spec.get("repro")
        if not isinstance(name, str) or "session" not in entry:
            raise BadInput(f"not a reprobox session in the nox listing: {entry!r}")
        cpu.append({"session": entry["session"], "repro": name})
        if not has_gpu_image(root, name):
            continue
        if call_spec.get("variant") == DEFAULT_CELL:
            repro = spec.load(root, name)
            for variant in repro.default_variants:
                gpu.append({"repro": name, "variant": variant, "args": f"--variant {variant}",
                            "gpus": repro.launch(variant).processes})  # fmt: skip
            continue
        if name not in known:
            known[name] = noxview.session_cells(root, name, axes)[1]
        cell = next((c for c in known[name] if c.call_spec == call_spec), None)
        if cell is None:
            raise BadInput(f"nox session {entry['session']!r} is not a cell of {name} any more")
        processes = spec.load(root, name).launch(call_spec["variant"]).processes
        gpu.append({"repro": name, "variant": call_spec["variant"], "args": " ".join(cell.args),
                    "gpus": processes})  # fmt: skip
    for what, rows in (("cpu", cpu), ("gpu", gpu)):
        if len(rows) > GITHUB_MATRIX_LIMIT:
            raise BadInput(
                f"{len(rows)} {what} jobs exceed GitHub's {GITHUB_MATRIX_LIMIT} per matrix; "
                "list fewer sessions (nox -t / -k)"
            )
    return {
        "cpu": {"include": cpu},
        "gpu": {"include": gpu},
        "repros": sorted({row["repro"] for row in cpu}),
    }


def canary_plan(root: Path) -> list[dict[str, Any]]:
    """(repro, package, variant, with) for the nightly canary: each repro's `fixed` variant
    against the newest release of each package the bug is about (matrix package axes, bisect
    package), `with` the other packages the variant pins exactly, moved to their newest
    releases too.

    A corpus bug still open upstream (`[truth] open = true`) is watched from the other side:
    its `broken` variant at the newest releases, expected to reproduce, so the night a release
    fixes it the job fails with that release (`clean, expected reproduced`) and its `[truth]`
    gains a `first_fixed`. Its `fixed` pins the last good release, and would reproduce at the
    newest by design. A corpus bug with no fix in its verified range and not said to be open
    is left out: its fix, if any, is unknown, and an old script often no longer runs at the
    newest releases (a `TrainingArguments` without `no_cuda`), an error every night.

    A newest release often needs newer companions than the repro pins (transformers 5.25
    needs an accelerate past ga_loss's 1.2.1): run beside the old pins, it is an error, and
    the canary would never see the bug come back. torch stays the repro's build: the CPU
    wheel, not the index's newest."""
    plan = []
    for name in spec.discover(root):
        try:
            repro = spec.load(root, name)
        except ReproboxError:
            continue  # a broken repro.toml fails the regular CI, not the canary
        truth = repro.spec.truth
        variant = "fixed"
        if truth is not None and truth.first_fixed is None:
            if not truth.open:
                continue
            variant = "broken"
        if variant not in repro.spec.variants:
            continue
        packages = list(repro.spec.matrix.packages) if repro.spec.matrix else []
        if repro.spec.bisect is not None:
            packages.append(repro.spec.bisect.package)
        pinned = _exact_pins(repro.requirements(variant))
        for package in dict.fromkeys(packages):
            companions = [p for p in pinned if p not in (canonicalize_name(package), "torch")]
            plan.append({"repro": name, "package": package, "variant": variant, "with": companions})
    return plan


def _exact_pins(requirements: Iterable[str]) -> list[str]:
    """The canonical names of the packages `requirements` pin to one version (`==`)."""
    names: list[str] = []
    for text in requirements:
        requirement = Requirement(text)
        if any(s.operator in ("==", "===") for s in requirement.specifier):
            names.append(canonicalize_name(requirement.name))
    return names
