"""Locks: `uv pip compile --generate-hashes` output headed by the hash of its inputs.

A stale lock is caught without touching the network; a lock for an override (a matrix cell, a
bisect probe) is resolved once into the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from reprobox.core.errors import EnvError
from reprobox.core.files import atomic_write
from reprobox.core.settings import Settings
from reprobox.envs import torch_source
from reprobox.envs.uv import run_uv, uv_bin

LOCK_HEADER = "# reprobox-lock input="
# Locks target Linux x86-64 so a lock regenerates the same anywhere (the images run there too).
PLATFORM_TAGS = {"cpu": "x86_64-manylinux_2_28", "gpu": "x86_64-manylinux_2_28"}


@dataclass(frozen=True)
class LockRequest:
    """Everything that determines a lock's content."""

    requirements: tuple[str, ...]
    python: str
    platform: str = "cpu"
    exclude_newer: str | None = None
    # (package, date): resolve these packages as of an earlier date (date bisection)
    exclude_newer_packages: tuple[tuple[str, str], ...] = ()
    # cpu: a CPU lock pins the CPU build of torch | pypi: the default index's build (the
    # fallback flavour; cached, never committed). Not part of a GPU lock.
    torch_source: str = "cpu"

    @property
    def input_hash(self) -> str:
        payload: dict[str, object] = {
            "requirements": sorted(self.requirements),
            "python": self.python,
            "platform": self.platform,
            "exclude_newer": self.exclude_newer,
        }
        if self.exclude_newer_packages:
            payload["exclude_newer_packages"] = sorted(self.exclude_newer_packages)
        if self.torch_source != "cpu":  # the committed locks' hashes stay as they are
            payload["torch_source"] = self.torch_source
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def lock_input_hash(lock: Path) -> str | None:
    """The input hash a lock was generated from, or None if it has no reprobox header."""
    try:
        first = lock.read_text().splitlines()[0]
    except (FileNotFoundError, IndexError):
        return None
    return first[len(LOCK_HEADER) :].strip() if first.startswith(LOCK_HEADER) else None


def compile_lock(request: LockRequest, dest: Path, settings: Settings) -> Path:
    """Resolve `request` with uv into a hashed lock at `dest` (written atomically)."""
    cmd = [
        uv_bin(),
        "pip",
        "compile",
        "-",
        "--quiet",
        "--generate-hashes",
        "--no-header",
        "--python-version",
        request.python,
        "--python-platform",
        PLATFORM_TAGS.get(request.platform, PLATFORM_TAGS["cpu"]),
    ]
    if request.exclude_newer:
        cmd += ["--exclude-newer", request.exclude_newer]
    for package, date in request.exclude_newer_packages:
        cmd += ["--exclude-newer-package", f"{package}={date}"]
    source = torch_source.from_settings(settings)
    pypi = request.torch_source == "pypi"
    if request.platform == "cpu":
        cmd += dataclasses.replace(source, flavour=request.torch_source).uv_args()
    requirements = [_without_local(r) if pypi else r for r in request.requirements]
    proc = run_uv(cmd, stdin="\n".join(requirements) + "\n", what="resolve", settings=settings)
    if request.platform == "cpu" and not pypi:
        _check_cpu_torch(proc.stdout, source)
    header = [
        f"{LOCK_HEADER}{request.input_hash}",
        f"# python {request.python}, platform {request.platform}"
        + (f", as of {request.exclude_newer}" if request.exclude_newer else "")
        + "".join(f", {p} as of {d}" for p, d in request.exclude_newer_packages)
        + (", torch from the default index (REPROBOX_TORCH_SOURCE=pypi)" if pypi else ""),
        *(f"#   {req}" for req in request.requirements),
        "# Regenerate with: nox -s lock",
    ]
    return atomic_write(dest, "\n".join(header) + "\n" + proc.stdout)


def for_torch_source(request: LockRequest, flavour: str) -> LockRequest:
    """`request` in the torch flavour asked for (REPROBOX_TORCH_SOURCE): a CPU lock becomes
    its pypi flavour; a GPU lock stays as it is."""
    if request.platform != "cpu" or request.torch_source == flavour:
        return request
    return dataclasses.replace(request, torch_source=flavour)


def _check_cpu_torch(lock_text: str, source: torch_source.TorchSource) -> None:
    """A CPU lock must pin the CPU build: where no source serves it, uv quietly falls back
    to the default index's CUDA build, and a lock would then say `cpu` and mean otherwise."""
    torch = torch_source.pinned_torch(lock_text)
    if torch is not None and torch.local is None:
        raise EnvError(
            f"cannot resolve: only the default index's torch=={torch} (the CUDA build) was "
            f"found, not the CPU build (tried: {source.tried()}); {source.hint()}"
        )


def _without_local(requirement: str) -> str:
    """`torch==2.13.0+cpu` as `torch==2.13.0`: the pypi flavour has no local builds."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return requirement
    if canonicalize_name(req.name) != "torch":
        return requirement
    specs = []
    for spec in req.specifier:
        version = spec.version.split("+", 1)[0] if spec.operator == "==" else spec.version
        specs.append(f"{spec.operator}{version}")
    req.specifier = type(req.specifier)(",".join(specs))
    return str(req)


def cached_lock(request: LockRequest, settings: Settings) -> Path:
    """A lock for `request` from the cache, resolved once (for cells and probes), in the torch
    flavour the settings ask for (`for_torch_source`)."""
    request = for_torch_source(request, settings.torch_source)
    dest = settings.cache / "locks" / f"{request.input_hash}.txt"
    if lock_input_hash(dest) == request.input_hash:
        return dest
    with FileLock(str(dest) + ".lock"):
        if lock_input_hash(dest) != request.input_hash:
            compile_lock(request, dest, settings)
    return dest
