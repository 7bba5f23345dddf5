"""Virtual environments, content-addressed by their lock.

Two variants, matrix cells or bisect probes with the same lock share one venv, and uv's
cache makes a new one cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name

from reprobox.core.settings import Settings
from reprobox.envs import torch_source
from reprobox.envs.uv import run_uv, uv_bin

READY_MARKER = ".reprobox-ready"


@dataclass(frozen=True)
class Env:
    """A ready virtual environment."""

    path: Path
    lock_hash: str
    created: bool = field(default=False, compare=False)

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name


def env_hash(
    lock: Path, python: str, install_env: dict[str, str], no_build_isolation: Sequence[str] = ()
) -> str:
    body = "\n".join(line for line in lock.read_text().splitlines() if not line.startswith("#"))
    inputs: dict[str, object] = {"lock": body, "python": python, "env": install_env}
    if no_build_isolation:
        inputs["late"] = sorted(no_build_isolation)
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def ensure_env(
    lock: Path,
    python: str,
    install_env: dict[str, str] | None = None,
    no_build_isolation: Sequence[str] = (),
    *,
    settings: Settings,
) -> Env:
    """Return the venv for `lock`, creating it (under a file lock) if it is not ready.

    A venv only counts once its marker is written, so one interrupted mid-install is rebuilt
    rather than trusted; concurrent runs wait for each other instead of installing twice.
    Packages in `no_build_isolation` (whose source build imports others from the lock, as
    deepspeed's imports torch) are installed last, against the venv.
    """
    install_env = install_env or {}
    digest = env_hash(lock, python, install_env, no_build_isolation)
    path = settings.cache / "envs" / digest
    if (path / READY_MARKER).is_file():
        return Env(path, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / READY_MARKER).is_file():
            return Env(path, digest)
        shutil.rmtree(path, ignore_errors=True)
        venv = [uv_bin(), "venv", "--quiet", "--python", python, str(path)]
        run_uv(venv, what="create venv", settings=settings)
        links = torch_args(lock.read_text(), settings)
        pip = [uv_bin(), "pip", "--quiet"]
        target = ["--require-hashes", "--python", str(path / "bin" / "python"), *links]
        first, late = split_lock(lock.read_text(), no_build_isolation)
        parts = path.with_name(path.name + ".parts")
        parts.mkdir(exist_ok=True)
        (parts / "first.txt").write_text(first)
        sync = [*pip, "sync", *target, str(parts / "first.txt")]
        run_uv(sync, what="install", env=install_env, settings=settings)
        if late:
            (parts / "late.txt").write_text(late)
            late_cmd = [*pip, "install", "--no-deps", "--no-build-isolation", *target]
            late_cmd += ["-r", str(parts / "late.txt")]
            run_uv(late_cmd, what="install", env=install_env, settings=settings)
        shutil.rmtree(parts, ignore_errors=True)
        (path / READY_MARKER).write_text(lock.read_text())
    return Env(path, digest, created=True)


def torch_args(lock_text: str, settings: Settings) -> list[str]:
    """The torch sources an install of this lock needs: a CPU build (`+cpu`) only lives on
    them; the default index's build (a GPU lock, the pypi flavour) must not be shadowed by
    a same-numbered local build from them."""
    torch = torch_source.pinned_torch(lock_text)
    if torch is None or torch.local is None:
        return []
    return dataclasses.replace(torch_source.from_settings(settings), flavour="cpu").uv_args()


def split_lock(text: str, late: Sequence[str]) -> tuple[str, str]:
    """A lock's entries without, and with only, the `late` packages (two installable files)."""
    wanted = {canonicalize_name(name) for name in late}
    first: list[str] = []
    second: list[str] = []
    target = first
    for line in text.splitlines(keepends=True):
        if line[:1] not in ("", " ", "#", "\n"):
            name = re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]
            target = second if canonicalize_name(name) in wanted else first
        target.append(line)
    return "".join(first), "".join(second)
