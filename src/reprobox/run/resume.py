"""`run --resume`: which cells need not run again, because their newest measured record was
made from the same lock, the same code and the same arguments.

"Measured" is a verdict that was judged and matched, missed, or was recorded (no
expectation); an error, an interrupted run and an undecided noisy cell are run again. The
code is every file of the repro's folder but its locks (compared through the lock's own
hash), plus every file of `fixes/` (on every launch's PYTHONPATH, so any of them may be
imported); the arguments are the script's. Anything this
cannot compare (a record from before these were kept, another back end's environment, the
host's torch) runs again, and says why.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from reprobox.core.cells import Cell, script_args
from reprobox.core.judge import Status
from reprobox.core.records import CellHistory, Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.envs import venvs
from reprobox.run.installs import env_inputs, lock_for

RESUMABLE = (Status.MATCH, Status.MISMATCH, Status.RECORDED)
_NOT_CODE = ("locks", "__pycache__")


@dataclass(frozen=True)
class Resumed:
    """A cell `run --resume` looked at: the record it keeps (None: the cell runs) and why."""

    cell: Cell
    record: Record | None
    why: str


def code_hash(repro: Repro, cell: Cell) -> str:
    """The code a cell may run: every file of the repro's folder (not its locks, not
    bytecode) and every file of `fixes/`, by path and content. All of `fixes/`, not only the
    variant's fix module: every launch has it on PYTHONPATH, so a script or a fix module may
    import any helper there, and a helper that changed must not keep a verdict (issue 35)."""
    digest = hashlib.sha256()
    root = repro.dir.parent.parent
    files = [p for p in sorted(repro.dir.rglob("*")) if p.is_file() and _is_code(repro.dir, p)]
    if repro.fixes_dir.is_dir():
        files += [p for p in sorted(repro.fixes_dir.rglob("*"))
                  if p.is_file() and _is_code(repro.fixes_dir, p)]  # fmt: skip
    fix = repro.variant(cell.variant).fix
    if fix and repro.fixes_dir / f"{fix}.py" not in files:
        files.append(repro.fixes_dir / f"{fix}.py")  # missing: its read fails, so it runs again
    for path in files:
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        digest.update(str(shown).encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:  # its content is unknown: a hash that matches nothing, so it runs again
            digest.update(os.urandom(16))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _is_code(base: Path, path: Path) -> bool:
    parts = path.relative_to(base).parts
    return not any(part in _NOT_CODE for part in parts[:-1]) and path.suffix != ".pyc"


def split(
    repro: Repro, cells: list[Cell], store: RecordStore, settings: Settings, backend: str
) -> list[Resumed]:
    """Each cell with the record that lets it be skipped, else None and why it runs."""
    histories, _ = store.histories(repro.name)
    newest = {(h.record.platform, h.record.label): h for h in histories}
    return [_one(repro, cell, newest.get((cell.platform, cell.label)), settings, backend)
            for cell in cells]  # fmt: skip


def _one(
    repro: Repro, cell: Cell, history: CellHistory | None, settings: Settings, backend: str
) -> Resumed:
    if history is None or not history.is_measured:
        return Resumed(cell, None, "no measured record")
    record = history.record
    if record.status not in RESUMABLE:
        return Resumed(cell, None, f"its newest measured record is {record.status}")
    if not record.code_hash:
        return Resumed(cell, None, "its record predates code hashes")
    if record.code_hash != code_hash(repro, cell):
        return Resumed(cell, None, f"the code changed since {record.started_at}")
    if record.script_args != script_args(repro, cell):
        return Resumed(cell, None, f"its arguments changed since {record.started_at}")
    if record.cell().identity() != cell.identity():
        return Resumed(cell, None, f"its packages or expectation changed since {record.started_at}")
    if backend != "venv" or not record.runner.startswith("venv"):
        return Resumed(cell, None, f"its environment ({record.runner}) is not compared here")
    if settings.torch_source == "host":
        return Resumed(cell, None, "the host's torch is not compared here")
    lock = lock_for(repro, cell.variant, cell.platform, dict(cell.packages), settings=settings)
    if venvs.env_hash(lock, *env_inputs(repro, cell.platform)) != record.lock_hash:
        return Resumed(cell, None, f"the lock changed since {record.started_at}")
    return Resumed(cell, record, f"{record.verdict or record.status}, measured {record.started_at}")
