"""Records of runs on disk: append-only, one directory per cell run, never overwritten.

Layout: `<results>/<repro>/<cell slug>/<timestamp>/` holding `record.json` (the harness's
judgement), `result.json` (the script's own), `launch.log` and `rank<N>.log`. A run that is
interrupted keeps every record already written; a reader takes the newest record per cell.
Bisections keep their probe log and summary under `<results>/<repro>/_bisect/<id>/`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reprobox.core.errors import BadInput

RECORD_FILE = "record.json"
RECORD_SCHEMA = 1


def results_dir(root: Path) -> Path:
    """Where results go (REPROBOX_RESULTS overrides; default `<checkout>/results`)."""
    if env := os.environ.get("REPROBOX_RESULTS"):
        return Path(env)
    return root / "results"


@dataclass
class Record:
    """What the harness concluded about one cell run."""

    repro: str
    variant: str
    label: str
    packages: dict[str, str]
    params: dict[str, str]
    expect: str
    also_ok: list[str]
    status: str  # match | mismatch | recorded | error
    verdict: str | None  # clean | reproduced | cannot_test | None on error
    reason: str = ""
    exit_code: int = 0  # the harness exit code this record implies on error
    metrics: dict[str, float] = field(default_factory=dict)
    decided_by: list[str] = field(default_factory=list)  # the metrics the verdict rule read
    result: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    returncode: int | None = None
    wall_s: float = 0.0  # the launch
    env_s: float = 0.0  # resolving and installing the environment
    preflight_s: float = 0.0  # the script's one-process check before launching
    lock: str = ""
    lock_hash: str = ""
    platform: str = "cpu"
    runner: str = "venv"  # venv, or the container engine that ran the image
    started_at: str = ""
    dir: str = ""
    batch_dir: str = ""  # set when the cell ran in a launch led by another cell's directory
    schema: int = RECORD_SCHEMA

    def save(self) -> Path:
        path = Path(self.dir) / RECORD_FILE
        tmp = path.with_name(RECORD_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> Record:
        data = json.loads(path.read_text())
        if data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"{path}: not a reprobox record (schema {data.get('schema')!r})")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def new_run_dir(root: Path, repro: str, slug: str, base: Path | None = None) -> Path:
    """A fresh directory for one cell run; names sort by time and never collide."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"
    path = (base or results_dir(root) / repro) / slug / stamp
    path.mkdir(parents=True, exist_ok=False)
    return path


class ForeignRecord(BadInput):
    """A record of another repro under this repro's folder: results of two repros never mix."""


def cell_dirs(root: Path, repro: str) -> list[Path]:
    """The folders of `repro`'s cells (not _bisect, _report, _images)."""
    base = results_dir(root) / repro
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def scan_cell(cell_dir: Path, repro: str) -> tuple[Record | None, list[tuple[Path, str]]]:
    """The newest readable record of one cell (by start, then by write time, so two runs in
    one second sort right), and every unreadable record with the reason."""
    best: tuple[tuple[str, float], Record] | None = None
    unreadable: list[tuple[Path, str]] = []
    for path in cell_dir.glob(f"*/{RECORD_FILE}"):
        try:
            record = Record.load(path)
        except (OSError, ValueError, TypeError) as exc:
            half = isinstance(exc, json.JSONDecodeError)
            unreadable.append(
                (path, f"{path}: {'not valid JSON (half-written?)' if half else exc}")
            )
            continue
        if record.repro != repro:
            raise ForeignRecord(
                f"{path} is a record of repro {record.repro!r}, not {repro!r}; "
                f"move it out of {cell_dir.parent}"
            )
        key = (record.started_at, written(path))
        if best is None or key > best[0]:
            best = (key, record)
    return (best[1] if best else None), unreadable


def latest_records(root: Path, repro: str) -> list[Record]:
    """The newest readable record of every cell of `repro` (half-written ones are skipped)."""
    found = (scan_cell(cell_dir, repro)[0] for cell_dir in cell_dirs(root, repro))
    return [record for record in found if record is not None]


def written(path: Path) -> float:
    """A file's modification time, 0 when it is gone."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
