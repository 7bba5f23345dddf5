"""Regenerate what repro.toml determines: each variant's hashed lock and the repro's Dockerfile.

`reprobox lock` (and `nox -s lock`) write them; `reprobox lock --check` (CI, the tests) only
reports what is stale or missing, so a committed lock can never silently disagree with the
repro.toml it claims to come from. A lock is current when the input hash written into it
matches the request repro.toml makes today and its body matches the body hash beside it; a
Dockerfile when its text equals the rendering. A lock whose body was edited with its header
kept is an integrity error under `check` (exit 6), not merely out of date.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from reprobox.core import spec
from reprobox.core.errors import EnvError, ExitCode
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
    repro.toml changes no file. `on_written` hears of each file written. Under `check`, a
    lock whose body does not match its body hash raises an integrity error (EnvError, exit
    6) naming it, with whatever else is out of date; without it, such a lock is rewritten."""
    root = settings.root
    repros = [spec.load(root, name) for name in names]
    problems: list[str] = []
    tampered: list[str] = []

    def due(path: Path, current: bool, why: str | None = None) -> bool:
        """Whether to write `path` now; under `check` an out-of-date file is noted instead."""
        if not current and check:
            problems.append(f"{_shown(path, root)} is {why or staleness(path)}")
        return not current and not check

    def wrote(path: Path) -> None:
        if on_written is not None:
            on_written(path)

    for repro in repros:
        for platform in dict.fromkeys(["cpu", *repro.spec.platforms]):
            for variant in repro.variants_on(platform):
                path = lock_path(repro, variant, platform)
                request = lock_request(repro, variant, platform)
                current = locks.lock_input_hash(path) == request.input_hash
                body = locks.body_problem(path) if current else None
                if body is not None and body.startswith("its body") and check:
                    tampered.append(_shown(path, root))
                    continue
                if due(path, current and body is None, "stale (no body hash)" if body else None):
                    locks.compile_lock(request, path, settings)
                    wrote(path)
        path, text = dockerfile_path(root, repro), render(repro)
        if due(path, path.is_file() and path.read_text() == text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            wrote(path)
    if tampered:
        also = f"; also out of date: {'; '.join(problems)}" if problems else ""
        raise EnvError(
            f"{', '.join(tampered)}: the lock's body does not match the hash in its header "
            f"(edited by hand, or corrupt); restore it from git or regenerate it with "
            f"`nox -s lock`{also}",
            exit_code=ExitCode.INTEGRITY,
        )
    return problems


def staleness(path: Path) -> str:
    """`stale` (it exists, generated from another repro.toml) or `missing`."""
    return "stale" if path.exists() else "missing"


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
