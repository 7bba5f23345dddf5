"""Records of runs on disk: append-only, one directory per cell run, never overwritten.

Layout: `<results>/<repro>/<cell slug>/<timestamp>/` holding `record.json` (the harness's
judgement), `result.json` (the script's own), `launch.log` and `rank<N>.log`. A run that is
interrupted keeps every record already written. `RecordStore` owns this layout and the one
rule for "the newest record of a cell", which the table, the report, collect and bisects
share. Bisections keep their probe log and summary under `<results>/<repro>/_bisect/<id>/`.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprobox.core.cells import Cell
from reprobox.core.errors import BadInput
from reprobox.core.files import atomic_write
from reprobox.core.judge import Judgement, Launched
from reprobox.core.protocol import RankExit

RECORD_FILE = "record.json"
RECORD_SCHEMA = 1


class Record(BaseModel):
    """What the harness concluded about one cell run."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    repro: str
    variant: str
    label: str
    packages: dict[str, str] = {}
    params: dict[str, str] = {}
    expect: str
    also_ok: list[str] = []
    status: str  # match | mismatch | recorded | error
    verdict: str | None  # clean | reproduced | cannot_test | None on error
    reason: str = ""
    exit_code: int = 0  # the harness exit code this record implies
    metrics: dict[str, float] = {}
    decided_by: list[str] = []  # the metrics the verdict rule read
    result: dict[str, Any] = {}
    command: list[str] = []
    returncode: int | None = None  # the launcher's exit status
    exits: list[RankExit] = []  # every process whose exit status is known
    wall_s: float = 0.0  # the launch
    env_s: float = 0.0  # resolving and installing the environment
    preflight_s: float = 0.0  # the script's one-process check before launching
    lock: str = ""
    lock_hash: str = ""
    commits: dict[str, str] = {}  # package -> the commit sha that ran (a git or checkout source)
    platform: str = "cpu"
    runner: str = "venv"  # venv, or the container engine that ran the image
    torch_source: str = ""  # where torch came from (an index, local folders, the default)
    # REPROBOX_TORCH_SOURCE=host: the host's torch (version, cuda, path, python, ...)
    host_torch: dict[str, str] = {}
    env_names: list[str] = []  # the variables the launched processes got (names, no values)
    started_at: str = ""
    dir: str = ""
    batch_dir: str = ""  # set when the cell ran in a launch led by another cell's directory
    record_schema: int = Field(default=RECORD_SCHEMA, alias="schema")

    @classmethod
    def for_cell(cls, cell: Cell, run_dir: Path) -> Record:
        """A record that says "error" until the pipeline has judged the run."""
        return cls(
            **cell.identity(),
            status="error",
            verdict=None,
            platform=cell.platform,
            started_at=utc_now(),
            dir=str(run_dir),
        )

    def apply(self, judged: Judgement, launched: Launched) -> None:
        """Take in the judge's word on this cell's launch."""
        self.wall_s = launched.wall_s
        self.exits = list(launched.exits)
        self.returncode = launched.launcher_code
        self.result, self.metrics = judged.result, judged.metrics
        self.decided_by = judged.decided_by
        self.verdict = judged.verdict.value if judged.verdict else None
        self.status = judged.status.value
        self.reason = judged.reason
        self.exit_code = int(judged.exit_code)

    def cell(self) -> Cell:
        """The cell this record measured (expectations as recorded)."""
        return Cell.from_identity(self.model_dump(), self.platform)

    def to_json(self) -> dict[str, Any]:
        """The record as it is written to disk."""
        return self.model_dump(mode="json", by_alias=True)

    def save(self) -> Path:
        path = Path(self.dir) / RECORD_FILE
        atomic_write(path, json.dumps(self.to_json(), indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: Path) -> Record:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else None
            raise ValueError(f"{path}: not a reprobox record (schema {schema!r})")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{path}: {where}: {first['msg']}") from None


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ForeignRecord(BadInput):
    """A record of another repro under this repro's folder: results of two repros never mix."""


class RecordStore:
    """The results folder: new run folders, and the newest record of each cell."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def repro_dir(self, repro: str) -> Path:
        return self.base / repro

    def bisect_dir(self, repro: str) -> Path:
        """Where `repro`'s bisects and sweeps keep their logs and summaries (one folder each)."""
        return self.repro_dir(repro) / "_bisect"

    def new_run_dir(self, repro: str, slug: str, base: Path | None = None) -> Path:
        """A fresh directory for one cell run; names sort by time and never collide.
        `base` puts it elsewhere (a bisect keeps its probes beside its log)."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"
        path = (base or self.repro_dir(repro)) / slug / stamp
        path.mkdir(parents=True, exist_ok=False)
        return path

    def cell_dirs(self, repro: str) -> list[Path]:
        """The folders of `repro`'s cells (not _bisect, _report, _images)."""
        base = self.repro_dir(repro)
        if not base.is_dir():
            return []
        return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))

    @staticmethod
    def newest(cell_dir: Path, repro: str) -> tuple[Record | None, list[tuple[Path, str]]]:
        """The newest readable record of one cell, and every unreadable one with the reason.

        Newest means the run that started last (an imported older run never hides a newer
        one); two runs in one second are told apart by when their record was written."""
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

    def scan(self, repro: str) -> tuple[list[Record], list[str]]:
        """The newest readable record of every cell of `repro` (one per platform and label,
        whatever folder spelling older versions used), and the unreadable records that may
        be newer than the one taken, with the reason."""
        newest: dict[tuple[str, str], tuple[tuple[str, float], Record]] = {}
        problems: list[str] = []
        for cell_dir in self.cell_dirs(repro):
            best, unreadable = self.newest(cell_dir, repro)
            taken = written(Path(best.dir) / RECORD_FILE) if best is not None else 0.0
            problems += [why for path, why in unreadable if written(path) >= taken]
            if best is None:
                continue
            key = (best.started_at, taken)
            cell = (best.platform, best.label)
            if cell not in newest or key > newest[cell][0]:
                newest[cell] = (key, best)
        return [record for _, record in newest.values()], problems

    def latest(self, repro: str) -> list[Record]:
        """The newest readable record of every cell of `repro` (unreadable ones skipped)."""
        return self.scan(repro)[0]


def written(path: Path) -> float:
    """A file's modification time, 0 when it is gone."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
