"""What a person sees: one line per cell, a verdict table, progress while cells run.

rich draws the progress and tables in a terminal; under CI or without a TTY the same
information comes as plain lines and a plain table sized to its content, so logs stay
readable. Text from records and repro.toml (labels, reasons, titles) is data: it is never
read as rich markup or emoji codes, so `broken[transformers=4.44.2]` keeps its version and a
reason holding `[/path]` prints as written. This module imports only `core` (and rich).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from rich.cells import cell_len
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from reprobox.core import repeated
from reprobox.core.cells import Cell
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record
from reprobox.core.scrub import secrets_out
from reprobox.core.settings import Settings

if TYPE_CHECKING:
    from reprobox.bisect.summary import BisectSummary, ProbeEntry

# a message stays one line; no `:name:` emoji codes replaced in messages
console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
out = Console(highlight=False, emoji=False)

_STATUS_STYLE = {"match": "green", "mismatch": "bold red", "recorded": "cyan", "error": "red"}
_STATUS_STYLE["undecided"] = "yellow"

TableFormat = Literal["auto", "rich", "plain", "markdown"]
TABLE_FORMATS: tuple[TableFormat, ...] = ("auto", "rich", "plain", "markdown")
_VERDICT_COLUMNS = (
    "repro", "cell", "expected", "verdict", "status", "decided by", "measured", "wall s"
)  # fmt: skip
_TALLY_ORDER = ("clean", "reproduced", "cannot_test", "error")


_ci = bool(os.environ.get("CI"))  # until `configure` is told (the CLI does, at its edge)


def configure(settings: Settings) -> None:
    """Take the process's settings (under CI: plain lines, no live progress)."""
    global _ci
    _ci = settings.ci


def interactive() -> bool:
    """Live progress only for a person at a terminal, never in CI logs."""
    return console.is_terminal and not _ci


def error(message: str) -> None:
    """The one error line; never a secret in it (CI logs are read by many)."""
    console.print(f"reprobox: error: {secrets_out(message)}", style="red", markup=False)


def info(message: str) -> None:
    console.print(message, markup=False)


def record_line(record: Record) -> None:
    """`lm_head broken: reproduced (expected reproduced) ok  lm_head/... 5.1s`"""
    verdict = shown_verdict(record)
    mark = {"match": "ok", "mismatch": "MISMATCH", "recorded": "recorded", "error": "ERROR"}
    mark["undecided"] = "UNDECIDED"
    shown = mark.get(record.status, record.status)
    if record.status == Status.MISMATCH and verdict == Verdict.CANNOT_TEST:
        shown = "CANNOT TEST"  # says nothing about the bug: not a verdict that missed
    line = (
        f"{record.repro} {record.label}: {verdict} (expected {record.expect}) "
        f"{shown}  {record.wall_s:.1f}s"
    )
    if record.reason:
        line += f"  - {record.reason}"
    console.print(secrets_out(line), style=_STATUS_STYLE.get(record.status), markup=False)


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
                TextColumn("{task.description}", markup=False),  # labels hold [brackets]
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
        tally = self.tally()
        done = f"  (done: {tally})" if tally else ""
        text = f"[{where}/{self.total}] {self.repro} {labels}{shared} ..."
        if self._progress is not None:
            self._progress.update(self._task, description=text + done)
        else:
            info(text + done)

    def done(self, record: Record) -> None:
        self.counts[record.verdict or "error"] = self.counts.get(record.verdict or "error", 0) + 1
        if self._progress is not None:
            self._progress.advance(self._task)
            self._progress.console.print()  # keep the finished line above the live bar
        record_line(record)

    def tally(self) -> str:
        """What has finished so far, `1 clean, 1 reproduced`, kept apart from the running
        cell so a count is never read as part of its label."""
        order = {verdict: index for index, verdict in enumerate(_TALLY_ORDER)}
        ranked = sorted(self.counts.items(), key=lambda item: (order.get(item[0], 99), item[0]))
        return ", ".join(f"{n} {verdict}" for verdict, n in ranked)


class BisectProgress:
    """One line per probe; in a terminal, a live status line while probes run."""

    def __init__(self, repro: str, verb: str = "bisecting") -> None:
        self.repro, self.verb, self.count = repro, verb, 0
        self._status: Any = None

    def __enter__(self) -> BisectProgress:
        if interactive():
            first = "confirming both ends" if self.verb == "bisecting" else "first probe"
            self._status = console.status(Text(f"{self.verb} {self.repro}: {first}"))
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()

    def probe(self, entry: ProbeEntry) -> None:
        self.count += 1
        verdict = entry.verdict or "skipped"
        again = f" (repeat {entry.attempt})" if entry.attempt > 1 else ""
        tags = "".join(f" ({tag})" for tag in entry.tags)
        if entry.resumed:
            source = "from the log"
        elif entry.same_as:
            source = f"same environment as {entry.same_as}"
        else:
            source = f"{entry.wall_s:.1f}s"
        reason = f" - {entry.reason}" if entry.skip else ""
        steps = entry.steps_left
        left = f"; about {steps} step{'s' * (steps != 1)} left" if steps else ""
        info(f"probe {self.count}: {entry.item}{tags}{again}: {verdict} ({source}){reason}{left}")
        if self._status is not None:
            self._status.update(Text(f"{self.verb} {self.repro}: {self.count} probes so far{left}"))


def bisect_summary(summary: BisectSummary) -> None:
    """The closing line, as `git bisect` ends, and where the details are."""
    info(
        f"{summary.distinct_probed} probed, {summary.launched} launched "
        f"({summary.skips} skipped, {summary.wall_s:.0f}s); summary: {summary.summary_path}"
    )
    if summary.kind == "sweep" and summary.events:
        from reprobox.bisect.summary import events_line  # one wording of events and bounds

        info(f"events: {events_line(summary.events, summary.versions)}")
    out.print(summary.result, markup=False, soft_wrap=True)  # one line, however long


def table_format(requested: str = "auto") -> TableFormat:
    """The table a reader can use: rich for a person at a terminal; a plain table, sized to
    its content and never wrapped, for CI logs, pipes and files."""
    if requested not in TABLE_FORMATS:
        raise ValueError(f"unknown table format {requested!r}; one of {', '.join(TABLE_FORMATS)}")
    if requested != "auto":
        return cast(TableFormat, requested)
    return "rich" if out.is_terminal and not _ci else "plain"


def shown_verdict(record: Record) -> str:
    """A record's verdict in words: "undecided" for a noisy cell its launches left open."""
    return record.verdict or ("undecided" if record.status == "undecided" else "error")


def verdict_rows(records: Iterable[Record]) -> list[tuple[str, ...]]:
    """The verdict table's rows (see `_VERDICT_COLUMNS`): one per cell, with the metrics its
    verdict rule read, else the reason."""
    rows: list[tuple[str, ...]] = []
    for record in records:
        decided = ", ".join(
            f"{name}={_fmt(record.metrics.get(name))}" for name in record.decided_by
        )
        if record.stat is not None:  # repeated launches: mean ± CI (n=...), not one number
            decided = repeated.summary(record.stat)
        rows.append(
            (
                record.repro,
                record.label,
                record.expect,
                shown_verdict(record),
                record.status,
                decided or record.reason,
                record.started_at,
                f"{record.wall_s:.1f}",
            )
        )
    return rows


def verdict_table(
    records: Iterable[Record], format: str = "auto", notes: Sequence[str] = ()
) -> None:
    """The verdict table: one row per cell, in the `format` its reader can use; `notes`
    (later runs that measured nothing) follow it, one line each."""
    records = list(records)
    rows = verdict_rows(records)
    chosen = table_format(format)
    if chosen == "rich":
        table = Table(title="reprobox verdicts", show_lines=False)
        for column in _VERDICT_COLUMNS:
            table.add_column(column, overflow="fold", justify=_justify(column))
        for record, cells in zip(records, rows, strict=True):
            # Text, not str: a cell's text is data, never markup
            table.add_row(*(Text(cell) for cell in cells), style=_STATUS_STYLE.get(record.status))
        out.print(table)
        for note in notes:
            out.print(Text(note))
        return
    text = (
        markdown_table(_VERDICT_COLUMNS, rows)
        if chosen == "markdown"
        else ("reprobox verdicts\n" + plain_table(_VERDICT_COLUMNS, rows))
    )
    _print_plain("\n\n".join([text, *(_one_line(note) for note in notes)]))


def plain_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart: one line per row, whatever the
    terminal width, so no word is ever split."""
    body = [[_one_line(cell) for cell in row] for row in rows]
    widths, right = _widths(header, body), [_justify(h) == "right" for h in header]
    lines = [header, ["-" * width for width in widths], *body]
    return "\n".join(_join(line, widths, right, "  ").rstrip() for line in lines)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub pipe table sized to its content: aligned as text, rendered in a comment."""
    body = [[_one_line(cell).replace("|", "\\|") for cell in row] for row in rows]
    widths, right = _widths(header, body), [_justify(h) == "right" for h in header]
    rule = ["-" * (w - 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True)]
    lines = [header, rule, *body]
    return "\n".join(f"| {_join(line, widths, right, ' | ')} |" for line in lines)


def _one_line(text: str) -> str:
    """A cell on one line: newlines and tabs in a reason would break the columns."""
    return " ".join(str(text).split())


def _widths(header: Sequence[str], body: list[list[str]]) -> list[int]:
    return [max(cell_len(cell) for cell in column) for column in zip(header, *body, strict=True)]


def _join(cells: Sequence[str], widths: list[int], right: list[bool], sep: str) -> str:
    padded = []
    for cell, width, flush_right in zip(cells, widths, right, strict=True):
        fill = " " * (width - cell_len(cell))
        padded.append(fill + cell if flush_right else cell + fill)
    return sep.join(padded)


def _justify(column: str) -> Literal["left", "right"]:
    return "right" if column == "wall s" else "left"


def _print_plain(text: str) -> None:
    """Print as written: no markup, no emoji codes, no wrapping, no colour."""
    out.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)


def repro_list(rows: list[dict[str, Any]]) -> None:
    """Every repro: its title, upstream and variants (`reprobox list`)."""
    for row in rows:
        out.print(Text.assemble((row["repro"], "bold"), f": {row['title']}"), soft_wrap=True)
        out.print(f"  upstream: {row['upstream']}", markup=False, soft_wrap=True)
        for name, variant in row["variants"].items():
            default = "" if variant["default"] else " (not default)"
            out.print(
                f"  - {name}: expect {variant['expect']}{default}  {variant['description']}",
                markup=False,
                soft_wrap=True,  # a pipe or file gets whole lines
            )


def repro_detail(detail: dict[str, Any]) -> None:
    """One repro in full (`reprobox list NAME`), from `cli.listing.detail`."""
    launch = detail["launch"]
    extras = [f"timeout {launch['timeout']:g}s"]
    extras += ["batched"] if launch["batch"] else []
    extras += ["with a preflight check"] if launch["preflight"] is not None else []
    lines: list[Text | str] = [
        Text.assemble((detail["repro"], "bold"), f": {detail['title']}"),
        f"  upstream:  {detail['upstream']}",
        *(f"  fix:       {link}" for link in detail["fix_links"]),
        f"  script:    {detail['script']}, launched with {launch['launcher']}, "
        f"{launch['processes']} process{'es' if launch['processes'] != 1 else ''} "
        f"({', '.join(extras)})",
        f"  verdict:   {_rule_text(detail['verdict'])}",
        f"  platforms: {', '.join(detail['platforms'])}",
    ]
    if detail["bisect"]:
        b = detail["bisect"]
        ends = "".join(f", {end} {b[end]}" for end in ("good", "bad") if b[end])
        lines.append(f"  bisect:    {b['package']}{ends} (variant {b['variant']})")
    lines.append("  variants:")
    for name, variant in detail["variants"].items():
        lines.append(f"    {name}: {_variant_text(variant)}")
        if variant["description"]:
            lines.append(f"      {variant['description']}")
    cells = detail["cells"]
    kinds = [cell["kind"] for cell in cells]
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    lines.append(f"  cells ({counts}):" if cells else "  cells: none")
    rows = [
        [
            cell["label"],
            cell["expect"] + "".join(f" (or {v})" for v in cell["also_ok"]),
            " ".join(["reprobox run", detail["repro"], *cell["run_args"]]),
        ]
        for cell in cells
    ]
    if rows:
        table = plain_table(["cell", "expected", "run it with"], rows).splitlines()
        lines += [f"    {line}" for index, line in enumerate(table) if index != 1]
    if detail["matrix_note"]:
        lines.append(f"  {detail['matrix_note']}")
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)


def _variant_text(variant: dict[str, Any]) -> str:
    also = "".join(f" (or {v})" for v in variant["also_ok"])
    parts = [f"expect {variant['expect']}{also}"]
    parts += [] if variant["default"] else ["not default"]
    parts += [f"fix {variant['fix']}"] if variant["fix"] else []
    parts += [f"pins {', '.join(variant['pins'])}"] if variant["pins"] else []
    parts += [f"only on {', '.join(variant['platforms'])}"] if variant["platforms"] else []
    if variant["launch"]:
        changes = ", ".join(f"{k} {_value(v)}" for k, v in variant["launch"].items())
        parts.append(f"launch: {changes}")
    if variant["verdict"]:
        parts.append(f"own rule: {_rule_text(variant['verdict'])}")
    return "; ".join(parts)


def _rule_text(rules: list[dict[str, Any]]) -> str:
    """`reproduced if kl > 0.1 or loss_gap > 0.5`: any rule that fires reproduces."""
    return "reproduced if " + " or ".join(f"{r['metric']} > {r['above']:g}" for r in rules)


def _value(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
