"""Regenerate what repro.toml determines: each variant's hashed lock and the repro's Dockerfile.

`reprobox lock` (and `nox -s lock`) write them; `reprobox lock --check` (CI, the tests) only
reports what is stale or missing, so a committed lock can never silently disagree with the
repro.toml it claims to come from. A lock is current when the input hash written into it
matches the request repro.toml makes today; a Dockerfile when its text equals the rendering.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from reprobox.core import spec
from reprobox.core.settings import Settings
from reprobox.envs import locks
from reprobox.run.dockerfile import dockerfile_path, render
from reprobox.run.pipeline import lock_path, lock_request


def regenerate(
    settings: Settings,
    names: Sequence[str],
    check: bool,
    on_written: Callable[[Path], None] | None = None,
) -> list[str]:
    """Bring the locks and Dockerfiles of `names` up to date with their repro.toml, or with
    `check` write nothing and return the problems (`repros/x/locks/a.cpu.txt is stale`).

    Every repro is loaded before anything is written, so a misspelt name or a malformed
    repro.toml changes no file. `on_written` hears of each file written."""
    root = settings.root
    repros = [spec.load(root, name) for name in names]
    problems: list[str] = []

    def due(path: Path, current: bool) -> bool:
        """Whether to write `path` now; under `check` an out-of-date file is noted instead."""
        if not current and check:
            problems.append(f"{_shown(path, root)} is {staleness(path)}")
        return not current and not check

    def wrote(path: Path) -> None:
        if on_written is not None:
            on_written(path)

    for repro in repros:
        for platform in dict.fromkeys(["cpu", *repro.spec.platforms]):
            for variant in repro.variants_on(platform):
                path = lock_path(repro, variant, platform)
                request = lock_request(repro, variant, platform)
                if due(path, locks.lock_input_hash(path) == request.input_hash):
                    locks.compile_lock(request, path, settings)
                    wrote(path)
        path, text = dockerfile_path(root, repro), render(repro)
        if due(path, path.is_file() and path.read_text() == text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            wrote(path)
    return problems


def staleness(path: Path) -> str:
    """`stale` (it exists, generated from another repro.toml) or `missing`."""
    return "stale" if path.exists() else "missing"


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
