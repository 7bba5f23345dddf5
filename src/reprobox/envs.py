"""Locks and virtual environments, built with uv.

A lock is the output of `uv pip compile --generate-hashes` for one requirement set, headed by
the hash of its inputs, so a stale lock is caught without touching the network. An
environment is content-addressed by the hash of its lock: two variants, matrix cells or bisect
probes with the same lock share one venv, and uv's cache makes a new one cheap.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name

from .errors import BadInput, EnvError
from .pipconfig import find_links

LOCK_HEADER = "# reprobox-lock input="
READY_MARKER = ".reprobox-ready"
# Locks target Linux x86-64 so a lock regenerates the same anywhere (the images run there too).
PLATFORM_TAGS = {"cpu": "x86_64-manylinux_2_28", "gpu": "x86_64-manylinux_2_28"}


def cache_dir() -> Path:
    """Where envs, cached locks and release lists live (REPROBOX_CACHE overrides)."""
    if env := os.environ.get("REPROBOX_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "reprobox"


def uv_bin() -> str:
    """The pinned uv that ships with the harness (the `uv` wheel), else one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise EnvError("uv is not installed; run `make` targets, which install it") from None
        return found


@functools.cache
def index_url() -> str:
    """The index uv resolves against (its default, or the UV_* settings), as uv reports it:
    release lists must come from where the locks come from, and no address is written here."""
    proc = subprocess.run(
        [uv_bin(), "pip", "compile", "-", "--emit-index-url", "--no-header", "--quiet"],
        input="", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("--index-url "):
            return line.split(None, 1)[1].strip().rstrip("/")
    raise EnvError(f"cannot tell which index uv uses: {summarize_uv_error(proc.stderr)}")


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
    proc = _run_uv(cmd, stdin="\n".join(request.requirements) + "\n", what="resolve")
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
) -> Env:
    """Return the venv for `lock`, creating it (under a file lock) if it is not ready.

    A venv only counts once its marker is written, so one interrupted mid-install is rebuilt
    rather than trusted; concurrent runs wait for each other instead of installing twice.
    Packages in `no_build_isolation` (whose source build imports others from the lock, as
    deepspeed's imports torch) are installed last, against the venv.
    """
    install_env = install_env or {}
    digest = env_hash(lock, python, install_env, no_build_isolation)
    path = cache_dir() / "envs" / digest
    if (path / READY_MARKER).is_file():
        return Env(path, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / READY_MARKER).is_file():
            return Env(path, digest)
        shutil.rmtree(path, ignore_errors=True)
        _run_uv([uv_bin(), "venv", "--quiet", "--python", python, str(path)], what="create venv")
        links = [arg for link in find_links() for arg in ("--find-links", link)]
        pip = [uv_bin(), "pip", "--quiet"]
        target = ["--require-hashes", "--python", str(path / "bin" / "python"), *links]
        first, late = split_lock(lock.read_text(), no_build_isolation)
        parts = path.with_name(path.name + ".parts")
        parts.mkdir(exist_ok=True)
        (parts / "first.txt").write_text(first)
        _run_uv([*pip, "sync", *target, str(parts / "first.txt")], what="install", env=install_env)
        if late:
            (parts / "late.txt").write_text(late)
            late_cmd = [*pip, "install", "--no-deps", "--no-build-isolation", *target]
            _run_uv([*late_cmd, "-r", str(parts / "late.txt")], what="install", env=install_env)
        shutil.rmtree(parts, ignore_errors=True)
        (path / READY_MARKER).write_text(lock.read_text())
    return Env(path, digest, created=True)


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


_NO_VERSION = re.compile(r"there is no version of ([^\s,]+)")


def _run_uv(
    cmd: list[str], *, what: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if proc.returncode == 0:
        return proc
    log = cache_dir() / "logs" / f"uv-{what.replace(' ', '-')}-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    summary = summarize_uv_error(proc.stderr)
    missing = _NO_VERSION.search(proc.stderr)
    if missing:
        raise BadInput(f"cannot {what}: no such version: {missing.group(1)} (uv log: {log})")
    raise EnvError(f"cannot {what}: {summary} (uv log: {log})")


def summarize_uv_error(stderr: str) -> str:
    """uv's error as one line: its first `error:` line and the first cause."""
    lines = [line.strip(" ×╰─▶│") for line in stderr.splitlines()]
    lines = [line.strip() for line in lines if line.strip()]
    head = next((line for line in lines if line.startswith("error:")), lines[0] if lines else "")
    cause = next((line for line in lines if line.startswith(("cause:", "Because", "hint:"))), "")
    text = f"{head.removeprefix('error:').strip()}" + (f"; {cause}" if cause else "")
    return text[:400] or "uv failed without a message"
