"""Import results made elsewhere (Kubernetes pods, another machine's results/) as records.

Two sources, one tree shape: the claim a Kubernetes Job wrote (`/out/<repro>/<cell slug>/`,
copied off its volume, or brought home with `kubectl cp` from a collector pod: any folder
above the cell folders will do), and run folders copied from another machine's results/.

Imported folders are untrusted: nothing under them is followed through a symbolic link,
the cell's folder name is computed here (never taken from what a pod wrote), files are
size-bounded, and a pod's result is judged by the one judge with the variant's own rule,
exactly as a local run. Existing records are never touched: each import gets a new folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from reprobox.core import spec
from reprobox.core.cells import Cell
from reprobox.core.errors import BadInput
from reprobox.core.judge import Launched, judge
from reprobox.core.records import RECORD_FILE, Record, RecordStore
from reprobox.run.exits import last_error, launcher_exits
from reprobox.scaleout.k8s import CELL_FILE, EXIT_FILE, STARTED_KEY

MAX_FILE_BYTES = 64 * 1024 * 1024  # a log or result larger than this is not imported
MAX_JSON_BYTES = 1024 * 1024  # cell.json / record.json: read whole, so bounded tighter


@dataclass
class Collected:
    records: list[Record]
    skipped: list[str]  # one line each: a directory that could not be imported, and why


def collect(source: Path, root: Path, store: RecordStore) -> Collected:
    """Import every per-cell output under `source` as a new record in `store`.

    Two shapes are understood: a pod's `/out/<repro>/<cell slug>/` (cell.json +
    result.json), judged here; and a run directory copied from another machine's results/
    (record.json), imported as it is. Nothing under `source` is changed."""
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
            if (directory / RECORD_FILE).is_file():
                found.records.append(_import_record(directory, root, store))
            else:
                found.records.append(_import_cell(directory, root, store))
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
    per-rank logs, none over the size bound) into a new run folder of `cell`."""
    run_dir = store.new_run_dir(cell.repro, cell.slug)
    for path in sorted(directory.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            raise BadInput(f"{path.name} is larger than {MAX_FILE_BYTES // 2**20} MiB")
        shutil.copyfile(path, run_dir / path.name, follow_symlinks=False)
    return run_dir


def _read_json(path: Path) -> object:
    """A small JSON file a pod or another machine wrote: bounded before it is read."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise BadInput(f"{path.name} is larger than {MAX_JSON_BYTES // 2**10} KiB")
    return json.loads(path.read_text())


def _started_at(data: dict[str, object], cell_file: Path) -> str:
    """When the pod started the cell: its own word (copies do not keep file times), checked
    to be a UTC instant; else the file's time."""
    text = data.get(STARTED_KEY)
    if isinstance(text, str):
        try:
            when = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            pass
        else:
            return when.strftime("%Y-%m-%dT%H:%M:%SZ")  # re-written: only this shape passes
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cell_file.stat().st_mtime))


def _import_record(directory: Path, root: Path, store: RecordStore) -> Record:
    _read_json(directory / RECORD_FILE)  # bounded and well-formed before the model sees it
    record = Record.load(directory / RECORD_FILE)
    spec.load(root, record.repro)  # an unknown repro is an error, not a new results dir
    run_dir = _copy_run(directory, store, record.cell())
    record.dir = str(run_dir)
    record.save()
    return record


def _import_cell(directory: Path, root: Path, store: RecordStore) -> Record:
    data = _read_json(directory / CELL_FILE)
    if not isinstance(data, dict):
        raise BadInput(f"{CELL_FILE} is not a JSON object")
    repro = spec.load(root, str(data["repro"]))
    platform = str(data.get("platform", "cpu"))
    repro.platform(platform)
    cell = Cell.from_identity(data, platform)
    repro.variant(cell.variant)  # an unknown variant is refused, not imported
    if directory.name != cell.slug:
        # The pod writes to /out/<repro>/<slug>: a folder named otherwise was moved or
        # planted, and would import as a cell it is not.
        raise BadInput(f"{CELL_FILE} is of cell {cell.slug}, not of this folder")
    run_dir = _copy_run(directory, store, cell)
    record = Record.for_cell(cell, run_dir)
    record.started_at = _started_at(data, directory / CELL_FILE)
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
    judged = judge(repro.rules(cell.variant), cell.expect, cell.also_ok, run_dir / "result.json",
                   launched)  # fmt: skip
    record.apply(judged, launched)
    if judged.verdict is None:
        record.reason += f"; pod exit {code}"
    record.wall_s = float(judged.result.get("wall_time_s") or 0.0)
    record.save()
    return record
