"""What a person sees: one line per cell, a verdict table, progress while cells run.

rich draws the progress and tables in a terminal; under CI or without a TTY the same
information comes as plain lines, so logs stay readable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from reprobox.core.cells import Cell
from reprobox.core.records import Record

console = Console(stderr=True, highlight=False, soft_wrap=True)  # a message stays one line
out = Console(highlight=False)

_STATUS_STYLE = {"match": "green", "mismatch": "bold red", "recorded": "cyan", "error": "red"}


def interactive() -> bool:
    """Live progress only for a person at a terminal, never in CI logs."""
    return console.is_terminal and not os.environ.get("CI")


def error(message: str) -> None:
    console.print(f"reprobox: error: {message}", style="red", markup=False)


def info(message: str) -> None:
    console.print(message, markup=False)


def record_line(record: Record) -> None:
    """`lm_head broken: reproduced (expected reproduced) ok  lm_head/... 5.1s`"""
    verdict = record.verdict or "error"
    mark = {"match": "ok", "mismatch": "MISMATCH", "recorded": "recorded", "error": "ERROR"}
    line = (
        f"{record.repro} {record.label}: {verdict} (expected {record.expect}) "
        f"{mark.get(record.status, record.status)}  {record.wall_s:.1f}s"
    )
    if record.reason:
        line += f"  - {record.reason}"
    console.print(line, style=_STATUS_STYLE.get(record.status), markup=False)


class CellProgress:
    """Progress over the cells of one invocation: a live bar in a terminal, lines elsewhere."""

    def __init__(self, repro: str, total: int) -> None:
        self.repro, self.total, self.index = repro, total, 0
        self.counts: dict[str, int] = {}
        self.started = time.monotonic()
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> CellProgress:
        if interactive():
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.repro, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start(self, cells: list[Cell]) -> None:
        first, self.index = self.index + 1, self.index + len(cells)
        where = f"{first}" if len(cells) == 1 else f"{first}-{self.index}"
        labels = ", ".join(cell.label for cell in cells)
        shared = " (one launch)" if len(cells) > 1 else ""
        text = f"[{where}/{self.total}] {self.repro} {labels}{shared} {self._tally()}"
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        else:
            info(f"{text} ...")

    def done(self, record: Record) -> None:
        self.counts[record.verdict or "error"] = self.counts.get(record.verdict or "error", 0) + 1
        if self._progress is not None:
            self._progress.advance(self._task)
            self._progress.console.print()  # keep the finished line above the live bar
        record_line(record)

    def _tally(self) -> str:
        return ", ".join(f"{n} {v}" for v, n in sorted(self.counts.items()))


class BisectProgress:
    """One line per probe; in a terminal, a live status line while probes run."""

    def __init__(self, repro: str) -> None:
        self.repro, self.count = repro, 0
        self._status: Any = None

    def __enter__(self) -> BisectProgress:
        if interactive():
            self._status = console.status(f"bisecting {self.repro}: confirming both ends")
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()

    def probe(self, entry: dict[str, Any]) -> None:
        self.count += 1
        verdict = entry.get("verdict") or "skipped"
        again = f" (repeat {entry['attempt']})" if entry.get("attempt", 1) > 1 else ""
        if entry.get("resumed"):
            source = "from the log"
        elif entry.get("same_as"):
            source = f"same environment as {entry['same_as']}"
        else:
            source = f"{entry.get('wall_s', 0):.1f}s"
        reason = f" - {entry.get('reason')}" if verdict == "skipped" else ""
        info(f"probe {self.count}: {entry['item']}{again}: {verdict} ({source}){reason}")
        if self._status is not None:
            self._status.update(f"bisecting {self.repro}: {self.count} probes so far")


def bisect_summary(summary: dict[str, Any]) -> None:
    """The closing line, as `git bisect` ends, and where the details are."""
    info(
        f"{summary['distinct_probed']} probed, {summary['launched']} launched "
        f"({summary['skips']} skipped, {summary['wall_s']:.0f}s); summary: "
        f"{summary['summary_path']}"
    )
    out.print(summary["result"], markup=False)


def verdict_table(records: Iterable[Record]) -> None:
    """The verdict table: one row per cell, with the metrics its verdict rule read."""
    table = Table(title="reprobox verdicts", show_lines=False)
    for column in ["repro", "cell", "expected", "verdict", "status", "decided by", "wall s"]:
        table.add_column(column, overflow="fold")
    for record in records:
        decided = ", ".join(
            f"{name}={_fmt(record.metrics.get(name))}" for name in record.decided_by
        )
        table.add_row(
            record.repro,
            record.label,
            record.expect,
            record.verdict or "error",
            record.status,
            decided or record.reason,
            f"{record.wall_s:.1f}",
            style=_STATUS_STYLE.get(record.status),
        )
    out.print(table)


def repro_list(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        out.print(f"[bold]{row['repro']}[/bold]: {row['title']}")
        out.print(f"  upstream: {row['upstream']}", markup=False)
        for name, variant in row["variants"].items():
            default = "" if variant["default"] else " (not default)"
            out.print(
                f"  - {name}: expect {variant['expect']}{default}  {variant['description']}",
                markup=False,
            )


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
