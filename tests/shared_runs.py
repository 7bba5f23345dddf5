"""Real runs and downloads that several tests read, made once per `pytest` session.

A repro's default run (`reprobox run NAME`, every default variant) is what
test_repros_e2e checks, what test_comment_paste_e2e reports on, and what test_images_e2e
compares its images with: run once, its records read by all three. Under pytest-xdist each
worker has its own session, so the first worker to ask runs it under a file lock in the
folder all workers share, and the others wait for it and read what it left (exit code,
output, records). Nothing here decides a verdict: each test asserts on the run itself.

The pasted comment's venvs install from a wheelhouse of the repro's locked wheels
(`reprobox wheelhouse`), downloaded once per lock into the cache the repro environments
live in, so pip resolves and installs with no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from reprobox.core import spec
from reprobox.core.settings import Settings


@dataclass(frozen=True)
class SharedRun:
    """What one real `reprobox run` left: its exit status, its output, its results folder."""

    returncode: int
    stdout: str
    stderr: str
    results: Path


def shared_dir(basetemp: Path, worker: str) -> Path:
    """The folder every worker of this session sees (a plain run: its own base temp)."""
    return basetemp.parent if worker != "master" else basetemp


def default_run(name: str, where: Path, timeout: float = 3600) -> SharedRun:
    """`reprobox run NAME` with its results under `where/NAME`, run once whoever asks first."""
    folder = where / f"default-run-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "done.json"
    with FileLock(str(folder / ".lock")):
        if not done.is_file():
            env = {**os.environ, "COLUMNS": "200", "REPROBOX_RESULTS": str(folder / "results")}
            ran = subprocess.run(
                [sys.executable, "-m", "reprobox", "run", name],
                capture_output=True, text=True, timeout=timeout, env=env,
            )  # fmt: skip
            kept = {"returncode": ran.returncode, "stdout": ran.stdout, "stderr": ran.stderr}
            done.write_text(json.dumps(kept))
    kept = json.loads(done.read_text())
    return SharedRun(kept["returncode"], kept["stdout"], kept["stderr"], folder / "results")


def _locks_key(root: Path, name: str) -> str:
    """A hash of the repro's default CPU locks: a new lock is a new wheelhouse."""
    repro = spec.load(root, name)
    digest = hashlib.sha256()
    for variant in repro.default_variants:
        lock = root / "repros" / name / "locks" / f"{variant}.cpu.txt"
        digest.update(lock.read_bytes() if lock.is_file() else variant.encode())
    return digest.hexdigest()[:16]


def wheelhouse(root: Path, name: str, timeout: float = 3600) -> Path:
    """A folder holding every wheel (or sdist) the repro's default CPU locks pin, made once
    by `reprobox wheelhouse` and kept in the harness's cache; a failed download raises."""
    cache = Settings.from_env().cache / "test-wheelhouse"
    folder = cache / f"{name}-{_locks_key(root, name)}"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / f"{folder.name}.lock")):
        stamp = folder / ".complete"
        if not stamp.is_file():
            made = subprocess.run(
                [sys.executable, "-m", "reprobox", "wheelhouse", name, "--out", str(folder)],
                capture_output=True, text=True, timeout=timeout,
                env={**os.environ, "COLUMNS": "200"},
            )  # fmt: skip
            if made.returncode != 0:
                raise RuntimeError(f"reprobox wheelhouse {name} failed: {made.stderr[-2000:]}")
            stamp.write_text("")
    return folder
