"""A scrubbed copy of a results folder: what CI uploads as artifacts, instead of the raw one.

The raw folder holds whatever the ranks printed (a token in a traceback, an index URL with its
password, a home directory) and whatever a script left in its run folder (a symlink to
`~/.netrc`, a checkpoint). An export keeps what a reader of the run needs, every byte of text
through `Scrubber`: for each cell its newest record with its logs and result, and the
folders the harness writes beside the cells (`_bisect`: probe logs, summaries and the probes'
runs; `_report`; `_images`: build logs). Links are never followed, files that are neither
text nor an image are left out, and so are oversized ones (a result over the protocol's
limit, which the judge never read, is never read here either); the summary names each.

The copy keeps the results layout (`<out>/<repro>/<cell>/<run>/...`), so it can be read as a
results folder (`REPROBOX_RESULTS=<out>`) and merged with other jobs' exports.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reprobox.core.errors import BadInput
from reprobox.core.protocol import MAX_RESULT_BYTES, size_text
from reprobox.core.records import RecordStore
from reprobox.core.scrub import Scrubber
from reprobox.run.backend import RESULT_FILE

# Folders the harness writes beside the cells, exported whole.
HARNESS_FOLDERS = ("_bisect", "_report", "_images")
MAX_FILE_BYTES = 32 * 1024 * 1024  # a log larger than this is left out, and named
TEXT_SUFFIXES = {
    ".json", ".jsonl", ".log", ".txt", ".md", ".csv", ".yaml", ".yml", ".toml", ".py",
    ".html", ".svg", ".out", ".err",
}  # fmt: skip
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}  # plots: copied as they are


@dataclass
class Exported:
    """What an export wrote and what it left out (path relative to the results, why)."""

    out: Path
    files: int = 0
    runs: int = 0
    left_out: list[tuple[str, str]] = field(default_factory=list)


def export(
    results: Path, repros: Iterable[str], out: Path, scrubber: Scrubber | None = None
) -> Exported:
    """Write the scrubbed copy of `repros`' results under `out` (which must be new or empty
    and outside `results`)."""
    results, out = results.absolute(), out.absolute()
    if out == results or out.is_relative_to(results) or results.is_relative_to(out):
        raise BadInput(f"-o {out}: the export must lie outside the results folder {results}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"-o {out}: exists and is not an empty folder; choose another")
    scrub = scrubber or Scrubber()
    store = RecordStore(results)
    done = Exported(out)
    for repro in repros:
        base = store.repro_dir(repro)
        if not base.is_dir() or base.is_symlink():
            continue
        for folder in sorted(_newest_runs(store, repro)):
            done.runs += 1
            _copy_tree(folder, results, out, scrub, done)
        for name in HARNESS_FOLDERS:
            if (base / name).is_dir() and not (base / name).is_symlink():
                _copy_tree(base / name, results, out, scrub, done)
    return done


def _newest_runs(store: RecordStore, repro: str) -> set[Path]:
    """The run folders of the newest record of every cell, where they lie now (a record
    names the folder it was written in, which may since have moved), with the folder of the
    launch a batched cell shared."""
    base = store.repro_dir(repro)
    records, _ = store.scan(repro)
    folders: set[Path] = set()
    for record in records:
        for recorded in (record.dir, record.batch_dir):
            if not recorded:
                continue
            name = Path(recorded).name
            for found in base.glob(f"*/{name}"):
                if found.is_dir() and not found.is_symlink():
                    folders.add(found)
    return folders


def _walk(top: Path) -> Iterator[Path]:
    """Every entry under `top`, links included but never followed."""
    for directory, dirs, files in os.walk(top, followlinks=False):
        for name in sorted(dirs + files):
            yield Path(directory) / name


def _copy_tree(top: Path, results: Path, out: Path, scrub: Scrubber, done: Exported) -> None:
    for path in _walk(top):
        relative = path.relative_to(results)
        try:
            info = path.lstat()
        except OSError as exc:
            done.left_out.append((str(relative), exc.strerror or "unreadable"))
            continue
        if stat.S_ISDIR(info.st_mode):
            continue
        if stat.S_ISLNK(info.st_mode):
            done.left_out.append((str(relative), "a link (never followed)"))
            continue
        if not stat.S_ISREG(info.st_mode):
            done.left_out.append((str(relative), "not a regular file"))
            continue
        if info.st_size > MAX_FILE_BYTES:
            done.left_out.append((str(relative), f"over {MAX_FILE_BYTES // 2**20} MiB"))
            continue
        if path.name == RESULT_FILE and info.st_size > MAX_RESULT_BYTES:
            # The judge never read it (over the protocol's limit): neither does the export.
            why = f"a result over {size_text(MAX_RESULT_BYTES)}, never read"
            done.left_out.append((str(relative), why))
            continue
        suffix = path.suffix.lower()
        dest = out / relative
        if suffix in IMAGE_SUFFIXES:
            _write(dest, path.read_bytes())
        elif suffix in TEXT_SUFFIXES:
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = data.decode("utf-8", errors="replace")
            _write(dest, scrubbed(text, suffix, scrub).encode())
        else:
            done.left_out.append((str(relative), "neither text nor an image"))
            continue
        done.files += 1


def scrubbed(text: str, suffix: str, scrub: Scrubber) -> str:
    """`text` with its secrets replaced; JSON stays valid JSON (values scrubbed one by one,
    keys included), other text is scrubbed as text."""
    if suffix == ".json":
        try:
            return json.dumps(scrub.data(json.loads(text)), indent=2, sort_keys=True) + "\n"
        except ValueError:
            return scrub.text(text)
    if suffix == ".jsonl":
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.dumps(scrub.data(json.loads(line)), sort_keys=True))
            except ValueError:
                lines.append(scrub.text(line))
        return "\n".join(lines) + ("\n" if lines else "")
    return scrub.text(text)


def _write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
