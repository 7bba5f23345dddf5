"""What a report reads besides the records (`data`): the repro's files as a reader saves them,
which variants have a committed CPU lock, the tail of each failed cell's launch log, and the
time it is generated. Read here, once, so `sections` stays pure: data in, sections out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reprobox.core import spec
from reprobox.core.records import Record

LOG_TAIL_LINES = 40
SHOWN_SUFFIXES = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}
TAILED = ("error", "mismatch")  # the statuses whose log tails the report shows


@dataclass(frozen=True)
class SourceFile:
    """One file of the repro as a reader saves it: `shown` is its name beside the script
    (`fixes/NAME.py` for a fix), `path` where it was read (a gist publishes it from there)."""

    shown: str
    text: str
    lang: str
    path: Path


@dataclass(frozen=True)
class ReportFiles:
    """Everything a report's sections need that is not a record."""

    sources: list[SourceFile] = field(default_factory=list)  # the script first
    locked: frozenset[str] = frozenset()  # variants with a committed locks/VARIANT.cpu.txt
    log_tails: dict[str, str] = field(default_factory=dict)  # a cell's log folder -> tail
    generated: str = ""  # "2026-12-02 01:30 UTC"


def log_dir(record: Record) -> str:
    """Where a cell's launch.log is: its batch's folder when it ran in a batch."""
    return str(Path(record.batch_dir or record.dir))


def read_files(repro: spec.Repro, records: Sequence[Record]) -> ReportFiles:
    """Read what the report shows from disk: an unreadable file is left out, as before."""
    return ReportFiles(
        sources=_sources(repro),
        locked=frozenset(
            v for v in repro.spec.variants if (repro.dir / "locks" / f"{v}.cpu.txt").is_file()
        ),
        log_tails={
            log_dir(r): _tail(Path(log_dir(r)) / "launch.log", LOG_TAIL_LINES)
            for r in records
            if r.status in TAILED
        },
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )


def _sources(repro: spec.Repro) -> list[SourceFile]:
    """The repro's script first (the one a person runs, when the harness's only wraps it),
    then its other files and the fixes its variants use."""
    main = repro.dir / (repro.spec.repro.by_hand or repro.spec.repro.script)
    files = [main]
    files += sorted(
        p for p in repro.dir.iterdir() if p.is_file() and p.suffix in SHOWN_SUFFIXES and p != main
    )
    fixes = {v.fix for v in repro.spec.variants.values() if v.fix}
    files += [repro.fixes_dir / f"{fix}.py" for fix in sorted(fixes)]
    found = []
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        shown = f"fixes/{path.name}" if path.parent == repro.fixes_dir else path.name
        found.append(SourceFile(shown, text, SHOWN_SUFFIXES.get(path.suffix, ""), path))
    return found


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
