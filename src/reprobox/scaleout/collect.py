"""Import results made elsewhere (Kubernetes pods, another machine's results/) as records.

Two sources, one tree shape: the claim a Kubernetes Job wrote (`/out/<repro>/<cell slug>/`,
copied off its volume, or brought home with `kubectl cp` from a collector pod: any folder
above the cell folders will do), and run folders copied from another machine's results/.

Imported folders are untrusted: nothing under them is followed through a symbolic link,
the cell's folder name is computed here (never taken from what a pod wrote), files are
size-bounded, and no verdict, status or expectation is taken from them. Every output, a
pod's or a copied run folder's, is judged here by the one judge from its result file and
exit codes, with the variant's own rule and the expectation the repro gives the cell now;
a `record.json` is read only for the cell's identity, its exit codes and its metadata. A
cell the repro does not define (variant, platform, an unpinned package, a param it has no
axis for) is refused, named. Existing records are never touched: each import gets a new
folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reprobox.core import spec
from reprobox.core.cells import Cell, requested_cells
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.judge import Judgement, Launched, Status, judge, peek_verdict
from reprobox.core.protocol import Verdict
from reprobox.core.records import RECORD_FILE, Record, RecordStore
from reprobox.core.spec import Repro
from reprobox.run.backend import RESULT_FILE
from reprobox.run.exits import last_error, launcher_exits
from reprobox.run.rank_logs import bound_logs
from reprobox.scaleout.k8s import CELL_FILE, EXIT_FILE, STARTED_KEY

MAX_FILE_BYTES = 64 * 1024 * 1024  # a log or result larger than this is not imported
MAX_JSON_BYTES = 1024 * 1024  # cell.json / record.json: read whole, so bounded tighter
UTC_SHAPE = "%Y-%m-%dT%H:%M:%SZ"
# A failed run's own exit code, kept when its record is imported (a timeout stays 124).
_FAILURE_CODES = frozenset(c.value for c in ExitCode if c not in
                           (ExitCode.OK, ExitCode.FAILED, ExitCode.CANNOT_TEST))  # fmt: skip
# What a copied record.json is still read for: how it ran, never what it concluded.
RECORD_METADATA = ("command", "env_s", "preflight_s", "lock", "lock_hash", "commits", "runner",
                   "torch_source", "host_torch", "env_names")  # fmt: skip


@dataclass
class Collected:
    records: list[Record]
    skipped: list[str]  # one line each: a directory that could not be imported, and why


def collect(source: Path, root: Path, store: RecordStore) -> Collected:
    """Import every per-cell output under `source` as a new record in `store`.

    Two shapes are understood: a pod's `/out/<repro>/<cell slug>/` (cell.json +
    result.json), judged here; and a run directory copied from another machine's results/
    (record.json), re-judged from its result.json and recorded exit codes. Nothing under
    `source` is changed."""
    if not source.is_dir():
        raise BadInput(f"{source}: no such directory to collect from")
    results = store.base.resolve()
    here = source.resolve()
    if here == results or results in here.parents or here in results.parents:
        raise BadInput(f"{source} overlaps {results}: collect from a copy outside results/")
    found = Collected([], [])
    outputs = [p.parent for p in _walk(source) if p.name in (CELL_FILE, RECORD_FILE)]
    dirs = sorted({d for d in outputs if not _hidden(d.relative_to(source))})
    if not dirs:
        raise BadInput(f"{source}: no cell outputs (cell.json or record.json) found")
    for directory in dirs:
        try:
            if (directory / CELL_FILE).is_file():  # a pod's: any record.json beside it is ignored
                found.records.append(_import_cell(directory, root, store))
            else:
                found.records.append(_import_record(directory, root, store))
        except (BadInput, OSError, ValueError, TypeError, KeyError) as exc:
            found.skipped.append(f"{directory}: {exc}")
    return found


def _walk(source: Path) -> list[Path]:
    """Every regular file under `source`, never through a symbolic link."""
    files = []
    for top, dirs, names in os.walk(source, followlinks=False):
        dirs[:] = [d for d in dirs if not (Path(top) / d).is_symlink()]
        files += [Path(top) / n for n in names if not (Path(top) / n).is_symlink()]
    return files


def _hidden(relative: Path) -> bool:
    """Report and bisect folders (`_report`, `_bisect`) are not cell outputs."""
    return any(part.startswith(("_", ".")) for part in relative.parts)


def _copy_run(directory: Path, store: RecordStore, cell: Cell) -> Path:
    """Copy the regular files of one output folder (no links, no sub-folders but the
    per-rank logs, none over the size bound) into a new run folder of `cell`, its logs and
    result scrubbed as a run's own are (a pod's launch.log holds what its ranks printed)."""
    run_dir = store.new_run_dir(cell.repro, cell.slug)
    for path in sorted(directory.iterdir()):
        if path.is_symlink() or not path.is_file() or path.name == RECORD_FILE:
            continue  # the record is written here, from the judge's word
        if path.stat().st_size > MAX_FILE_BYTES:
            raise BadInput(f"{path.name} is larger than {MAX_FILE_BYTES // 2**20} MiB")
        shutil.copyfile(path, run_dir / path.name, follow_symlinks=False)
    bound_logs(run_dir)  # kept like a run's own: capped, scrubbed of secrets (so is the result)
    return run_dir


def _read_json(path: Path) -> object:
    """A small JSON file a pod or another machine wrote: bounded before it is read."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise BadInput(f"{path.name} is larger than {MAX_JSON_BYTES // 2**10} KiB")
    return json.loads(path.read_text())


def _started_at(text: object, file: Path) -> str:
    """When the cell started: the output's own word (copies do not keep file times), checked
    to be a UTC instant not later than now (a claimed future start would make it the
    newest record of its cell forever); else the file's time."""
    if isinstance(text, str):
        try:
            when = datetime.strptime(text, UTC_SHAPE).replace(tzinfo=UTC)
        except ValueError:
            pass
        else:
            if when > datetime.now(UTC):
                raise BadInput(f"started_at {text} is in the future")
            return when.strftime(UTC_SHAPE)  # re-written: only this shape passes
    return time.strftime(UTC_SHAPE, time.gmtime(file.stat().st_mtime))


def cell_of(repro: Repro, identity: Mapping[str, Any], platform: str) -> Cell:
    """The cell an output claims to be, as this checkout's repro defines it: its variant on
    that platform, pinned packages at valid versions, and params the repro has an axis for
    (else BadInput, named); its expectation is the repro's for it now, never the claim's."""
    claimed = Cell.from_identity(identity, platform)
    axes = repro.spec.matrix.params if repro.spec.matrix else {}
    unknown = [name for name, _ in claimed.params if name not in axes]
    if unknown:
        has = f"its params: {', '.join(axes)}" if axes else "it defines no params"
        raise BadInput(f"param {unknown[0]!r} is not one that {repro.name} defines ({has})")
    [cell] = requested_cells(repro, [claimed.variant], dict(claimed.packages),
                             dict(claimed.params), platform)  # fmt: skip
    return cell


def _judge_into(
    record: Record, repro: Repro, cell: Cell, run_dir: Path, launched: Launched
) -> Record:
    """The one judge's word on the copied output, into its new record, saved."""
    judged = judge(repro.rules(cell.variant), cell.expect, cell.also_ok, run_dir / RESULT_FILE,
                   launched)  # fmt: skip
    record.apply(judged, launched)
    record.save()
    return record


def _import_record(directory: Path, root: Path, store: RecordStore) -> Record:
    """A run folder copied from another machine: re-judged from its result.json and the
    exit codes its record lists. A record of a failed run stays a failure (the judge reads
    only the launch; the harness may have failed it for more)."""
    _read_json(directory / RECORD_FILE)  # bounded and well-formed before the model sees it
    source = Record.load(directory / RECORD_FILE)
    repro = spec.load(root, source.repro)  # an unknown repro is an error, not a new results dir
    repro.platform(source.platform)
    cell = cell_of(repro, source.model_dump(), source.platform)
    started = _started_at(source.started_at, directory / RECORD_FILE)
    run_dir = _copy_run(directory, store, cell)
    record = Record.for_cell(cell, run_dir)
    record.started_at = started
    for name in RECORD_METADATA:
        setattr(record, name, getattr(source, name))
    exits = tuple(source.exits)
    launched = Launched(
        exits=exits,
        wall_s=source.wall_s,
        logs=run_dir,
        last_error=last_error(sorted(run_dir.glob("*.log"))),
        launcher_stops_peers=any(e.rank is None for e in exits),  # a launcher's, not ours
    )
    if source.status == Status.ERROR.value:
        failed = source.exit_code in _FAILURE_CODES
        why = f"the run failed where it ran: {source.reason or 'no reason given'}"
        return _failed(record, launched, why, ExitCode(source.exit_code) if failed else None)
    if not exits and peek_verdict(run_dir / RESULT_FILE) is not Verdict.CANNOT_TEST:
        # only the harness's own cannot-test (too few GPUs) ends without a launch
        why = "its record lists no exit status: a result is not taken on its own word"
        return _failed(record, launched, f"{why}; logs in {run_dir}")
    return _judge_into(record, repro, cell, run_dir, launched)


def _failed(
    record: Record, launched: Launched, reason: str, code: ExitCode | None = None
) -> Record:
    """An output that cannot be judged: an error record, never a verdict."""
    failure = Judgement(verdict=None, status=Status.ERROR, reason=reason,
                        exit_code=code or ExitCode.RUN_FAILED)  # fmt: skip
    record.apply(failure, launched)
    record.save()
    return record


def _import_cell(directory: Path, root: Path, store: RecordStore) -> Record:
    """A pod's output: cell.json, result.json, exit_code and launch.log."""
    data = _read_json(directory / CELL_FILE)
    if not isinstance(data, dict):
        raise BadInput(f"{CELL_FILE} is not a JSON object")
    repro = spec.load(root, str(data["repro"]))
    platform = str(data.get("platform", "cpu"))
    repro.platform(platform)
    cell = cell_of(repro, data, platform)
    if directory.name != cell.slug:
        # The pod writes to /out/<repro>/<slug>: a folder named otherwise was moved or
        # planted, and would import as a cell it is not.
        raise BadInput(f"{CELL_FILE} is of cell {cell.slug}, not of this folder")
    started = _started_at(data.get(STARTED_KEY), directory / CELL_FILE)
    run_dir = _copy_run(directory, store, cell)
    record = Record.for_cell(cell, run_dir)
    record.started_at = started
    record.command = [*map(str, data.get("launch", [])), *map(str, data.get("args", []))]
    exit_text = (run_dir / EXIT_FILE).read_text().strip() if (run_dir / EXIT_FILE).is_file() else ""
    code = int(exit_text) if exit_text.lstrip("-").isdigit() else None
    log = run_dir / "launch.log"
    launched = Launched(
        exits=launcher_exits(code, log),
        logs=run_dir,
        last_error=last_error([log]),
        launcher_stops_peers=True,
    )
    if code is None:  # killed before its launch ended: a result alone is no verdict
        why = f"the pod wrote no readable {EXIT_FILE} (it ended before its launch did?)"
        return _failed(record, launched, f"{why}; logs in {run_dir}")
    _judge_into(record, repro, cell, run_dir, launched)
    if record.verdict is None:
        record.reason += f"; pod exit {code}"
    record.wall_s = float(record.result.get("wall_time_s") or 0.0)
    record.save()
    return record
