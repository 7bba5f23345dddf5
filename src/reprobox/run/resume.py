"""`run --resume`: which cells need not run again, because their newest measured record was
made from the same lock, the same code and the same arguments.

"Measured" is a verdict that was judged and matched, missed, or was recorded (no
expectation); an error, an interrupted run and an undecided noisy cell are run again. The
code is every file of the repro's folder but its locks (compared through the lock's own
hash), plus the fix module the variant loads; the arguments are the script's. Anything this
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
from reprobox.run.environments import env_inputs, lock_for

RESUMABLE = (Status.MATCH, Status.MISMATCH, Status.RECORDED)
_NOT_CODE = ("locks", "__pycache__")


@dataclass(frozen=True)
class Resumed:
    """A cell `run --resume` looked at: the record it keeps (None: the cell runs) and why."""

    cell: Cell
    record: Record | None
    why: str


def code_hash(repro: Repro, cell: Cell) -> str:
    """The repro's code as a cell runs it: every file of its folder (not its locks, not
    bytecode), by path and content, and the variant's fix module."""
    digest = hashlib.sha256()
    files = [p for p in sorted(repro.dir.rglob("*")) if p.is_file() and _is_code(repro.dir, p)]
    fix = repro.variant(cell.variant).fix
    if fix:
        files.append(repro.fixes_dir / f"{fix}.py")
    for path in files:
        digest.update(str(path.relative_to(repro.dir.parent.parent)).encode() + b"\0")
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
