"""Locks: `uv pip compile --generate-hashes` output headed by the hash of its inputs.

A stale lock is caught without touching the network; a lock for an override (a matrix cell, a
bisect probe) is resolved once into the cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from reprobox.core.settings import cache_dir
from reprobox.envs.torch_source import find_links
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

    @property
    def input_hash(self) -> str:
        payload = {
            "requirements": sorted(self.requirements),
            "python": self.python,
            "platform": self.platform,
            "exclude_newer": self.exclude_newer,
        }
        if self.exclude_newer_packages:
            payload["exclude_newer_packages"] = sorted(self.exclude_newer_packages)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def lock_input_hash(lock: Path) -> str | None:
    """The input hash a lock was generated from, or None if it has no reprobox header."""
    try:
        first = lock.read_text().splitlines()[0]
    except (FileNotFoundError, IndexError):
        return None
    return first[len(LOCK_HEADER) :].strip() if first.startswith(LOCK_HEADER) else None


def compile_lock(request: LockRequest, dest: Path) -> Path:
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
    if request.platform == "cpu":
        for link in find_links():
            cmd += ["--find-links", link]
    proc = run_uv(cmd, stdin="\n".join(request.requirements) + "\n", what="resolve")
    header = [
        f"{LOCK_HEADER}{request.input_hash}",
        f"# python {request.python}, platform {request.platform}"
        + (f", as of {request.exclude_newer}" if request.exclude_newer else "")
        + "".join(f", {p} as of {d}" for p, d in request.exclude_newer_packages),
        *(f"#   {req}" for req in request.requirements),
        "# Regenerate with: nox -s lock",
    ]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text("\n".join(header) + "\n" + proc.stdout)
    tmp.replace(dest)
    return dest


def cached_lock(request: LockRequest) -> Path:
    """A lock for `request` from the cache, resolved once (for cells and probes)."""
    dest = cache_dir() / "locks" / f"{request.input_hash}.txt"
    if lock_input_hash(dest) == request.input_hash:
        return dest
    with FileLock(str(dest) + ".lock"):
        if lock_input_hash(dest) != request.input_hash:
            compile_lock(request, dest)
    return dest
