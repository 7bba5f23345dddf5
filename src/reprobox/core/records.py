"""Records of runs on disk: append-only, one directory per cell run, never overwritten.

Layout: `<results>/<repro>/<cell slug>/<timestamp>/` holding `record.json` (the harness's
judgement), `result.json` (the script's own), `launch.log` and `rank<N>.log`. A run that is
interrupted keeps every record already written. `RecordStore` owns this layout and the one
rule for "the newest measured record of a cell", which the table, the report, collect and
bisects share: a later run that measured nothing (interrupted, errored, never launched) is
kept beside it, never in its place. Bisections keep their probe log and summary under
`<results>/<repro>/_bisect/<id>/`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprobox.core.cells import Cell
from reprobox.core.errors import BadInput
from reprobox.core.files import atomic_write
from reprobox.core.judge import Judgement, Launched, Status
from reprobox.core.protocol import MAX_RESULT_BYTES, RankExit, Verdict, size_text
from reprobox.core.scrub import secrets_out

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
    status: Status  # match | mismatch | recorded | error | undecided
    verdict: Verdict | None  # None on error and undecided
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
    # what `run --resume` compares (run/resume.py): the repro folder's files and the fix the
    # cell ran with, and the script's arguments; older records lack them (never skipped)
    code_hash: str = ""
    script_args: list[str] = []
    commits: dict[str, str] = {}  # package -> the commit sha that ran (a git or checkout source)
    platform: str = "cpu"
    runner: str = "venv"  # venv, or the container engine that ran the image
    image: str = ""  # the digest (sha256:...) of the image the cell ran in; "" for a venv
    # the machine under the launch (run/machine.py): kernel, cpu, cpu_flags, dev_shm, gpu,
    # driver, cuda_runtime, nccl, image, and `env NAME` for its NCCL_/CUDA_/TORCH_ variables
    machine: dict[str, str] = {}
    torch_source: str = ""  # where torch came from (an index, local folders, the default)
    # REPROBOX_TORCH_SOURCE=host: the host's torch (version, cuda, path, python, ...)
    host_torch: dict[str, str] = {}
    env_names: list[str] = []  # the variables the launched processes got (names, no values)
    # the repro's files the launch read (`gen_old.py`, `fixes/x.py`; run/reads.py): what a
    # report's pasted comment must hold; empty when not known (another back end, older)
    files_read: list[str] = []
    started_at: str = ""
    dir: str = ""
    batch_dir: str = ""  # set when the cell ran in a launch led by another cell's directory
    # a noisy cell ([verdict] repeats): every launch (verdict, metrics, seed, folder) and the
    # test that decided (name, statistic, p, interval, n, alpha, effect); older records lack them
    samples: list[dict[str, Any]] = []
    stat: dict[str, Any] | None = None
    record_schema: int = Field(default=RECORD_SCHEMA, alias="schema")

    @classmethod
    def for_cell(cls, cell: Cell, run_dir: Path) -> Record:
        """A record that says "error" until the pipeline has judged the run."""
        return cls(
            **cell.identity(),
            status=Status.ERROR,
            verdict=None,
            platform=cell.platform,
            started_at=utc_now(),
            dir=str(run_dir),
        )

    def apply(self, judged: Judgement, launched: Launched) -> None:
        """Take in the judge's word on this cell's launch; what the script said (result,
        reason) is stored without secrets, since records are shown and shared."""
        self.wall_s = launched.wall_s
        self.exits = list(launched.exits)
        self.returncode = launched.launcher_code
        self.result, self.metrics = secrets_out(judged.result), judged.metrics
        self.decided_by = judged.decided_by
        self.verdict = judged.verdict
        self.status = judged.status
        self.reason = secrets_out(judged.reason)
        self.exit_code = int(judged.exit_code)
        self.samples, self.stat = secrets_out(judged.samples), judged.stat

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
        """A record read back; one over MAX_RECORD_BYTES is refused before it is read (the
        table and the report stay small whatever lies on disk)."""
        size = path.stat().st_size
        if size > MAX_RECORD_BYTES:
            raise ValueError(
                f"{path}: {size_text(size)}, over the {size_text(MAX_RECORD_BYTES)} a record may "
                "hold (not read)"
            )
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


# A record holds one result (at most MAX_RESULT_BYTES) and a few small fields.
MAX_RECORD_BYTES = MAX_RESULT_BYTES + 6 * 1024 * 1024


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def measured(record: Record) -> bool:
    """A record that says something about the bug: the judge reached a verdict (clean,
    reproduced, cannot test) from a run that ended. Interrupted, errored and never-launched
    runs measured nothing. An undecided noisy cell measured that its launches decide neither
    way: no verdict, and no older one shown in its place."""
    if record.status == Status.UNDECIDED:
        return True
    return record.verdict is not None and record.status != Status.ERROR


@dataclass(frozen=True)
class CellHistory:
    """One cell's runs as its readers need them: the record its verdict comes from, and the
    later runs that measured nothing (listed with their time, never in its place)."""

    record: Record  # the newest measured record, else the newest record
    unmeasured: tuple[Record, ...] = ()  # runs newer than `record` that measured nothing

    @property
    def is_measured(self) -> bool:
        return measured(self.record)

    @classmethod
    def of(cls, runs: list[tuple[tuple[str, float], Record]]) -> CellHistory:
        """From every readable run of a cell, keyed by (started_at, record written): newest
        means the run that started last (an imported older run never hides a newer one);
        two runs in one second are told apart by when their record was written."""
        ordered = [record for _, record in sorted(runs, key=lambda run: run[0], reverse=True)]
        for index, record in enumerate(ordered):
            if measured(record):
                return cls(record, tuple(ordered[:index]))
        return cls(ordered[0], ())


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

    def histories(self, repro: str) -> tuple[list[CellHistory], list[str]]:
        """Every cell of `repro` (one per platform and label, whatever folder spelling older
        versions used): its newest measured record and the later runs that measured nothing,
        and the unreadable records that may be newer than the one taken, with the reason."""
        runs: dict[tuple[str, str], list[tuple[tuple[str, float], Record]]] = {}
        unreadable: list[tuple[Path, str]] = []
        where: dict[int, Path] = {}  # a record -> the file it was read from
        for cell_dir in self.cell_dirs(repro):
            for path in cell_dir.glob(f"*/{RECORD_FILE}"):
                try:
                    record = Record.load(path)
                except (OSError, ValueError, TypeError) as exc:
                    half = isinstance(exc, json.JSONDecodeError)
                    why = "not valid JSON (half-written?)" if half else exc
                    unreadable.append((path, f"{path}: {why}"))
                    continue
                if record.repro != repro:
                    raise ForeignRecord(
                        f"{path} is a record of repro {record.repro!r}, not {repro!r}; "
                        f"move it out of {cell_dir.parent}"
                    )
                key = (record.started_at, written(path))
                where[id(record)] = path
                runs.setdefault((record.platform, record.label), []).append((key, record))
        found = [CellHistory.of(cell) for cell in runs.values()]
        taken: dict[Path, float] = {}  # cell folder -> when the record taken from it was written
        for history in found:
            path = where[id(history.record)]
            taken[path.parent.parent] = max(taken.get(path.parent.parent, 0.0), written(path))
        problems = [
            why for path, why in unreadable if written(path) >= taken.get(path.parent.parent, 0.0)
        ]
        return found, problems

    def scan(self, repro: str) -> tuple[list[Record], list[str]]:
        """The newest measured record of every cell of `repro` (see `CellHistory`), and the
        unreadable records that may be newer than the one taken, with the reason."""
        found, problems = self.histories(repro)
        return [h.record for h in found], problems

    def latest(self, repro: str) -> list[Record]:
        """The newest measured record of every cell of `repro` (unreadable ones skipped)."""
        return self.scan(repro)[0]


def written(path: Path) -> float:
    """A file's modification time, 0 when it is gone."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
