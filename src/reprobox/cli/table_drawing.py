"""The verdict table, drawn for its reader: rich at a terminal, a plain table sized to its
content for CI logs, pipes and files, a pipe table for a comment; and the tally line that ends
a run or `make repro` (`11 of 11 verdicts as expected`).

At a terminal the table is fitted to its width: a column is never narrower than its longest
word, so no token (`6.89`, `…,model=llama]`) is ever split across lines. When the columns do
not fit, the least needed are dropped, and as a last resort the longest cells are cut with
`…`; a footnote line says what was dropped or cut. Drawn through `ui.out` (its one console).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal, cast

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from reprobox.cli import ui
from reprobox.cli.columns import justify, markdown_table, one_line, plain_table
from reprobox.core import repeat_verdict
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record

TableFormat = Literal["auto", "rich", "plain", "markdown"]
TABLE_FORMATS: tuple[TableFormat, ...] = ("auto", "rich", "plain", "markdown")
VERDICT_COLUMNS = (
    "repro", "cell", "expected", "verdict", "status", "decided by", "measured", "wall s"
)  # fmt: skip
# Dropped in this order when a terminal is too narrow: what the verdict and its evidence do
# not need (when it was measured, how long it ran; the repro, then named in the title; the
# expectation, whose miss the status column and the tally line still say).
DROP_ORDER = ("measured", "wall s", "repro", "expected", "status")
CUTTABLE = ("cell", "decided by")  # the last resort: their longest cells cut with "…"


def table_format(requested: str = "auto") -> TableFormat:
    """The table a reader can use: rich for a person at a terminal; a plain table, sized to
    its content and never wrapped, for CI logs, pipes and files."""
    if requested not in TABLE_FORMATS:
        raise ValueError(f"unknown table format {requested!r}; one of {', '.join(TABLE_FORMATS)}")
    if requested != "auto":
        return cast(TableFormat, requested)
    return "rich" if ui.out.is_terminal and not ui.ci() else "plain"


def verdict_rows(records: Iterable[Record]) -> list[tuple[str, ...]]:
    """The verdict table's rows (see `VERDICT_COLUMNS`): one per cell, with the metrics its
    verdict rule read, else the reason."""
    rows: list[tuple[str, ...]] = []
    records = list(records)
    # cells batched into one launch share its wall time and start: said, not shown as each's
    launches = Counter(record.batch_dir or record.dir for record in records if record.dir)
    for record in records:
        shared = launches[record.batch_dir or record.dir] if record.dir else 1
        wall = f"{record.wall_s:.1f}" + (f" (one launch of {shared})" if shared > 1 else "")
        decided = ", ".join(
            f"{name}={_fmt(record.metrics.get(name))}" for name in record.decided_by
        )
        if record.stat is not None:  # repeated launches: mean ± CI (n=...), not one number
            decided = repeat_verdict.summary(record.stat)
        rows.append(
            (
                record.repro,
                record.label,
                record.expect,
                ui.shown_verdict(record),
                record.status,
                decided or record.reason,
                record.started_at,
                wall,
            )
        )
    return rows


def verdict_table(
    records: Iterable[Record],
    format: str = "auto",
    notes: Sequence[str] = (),
    tally: bool = False,
) -> None:
    """The verdict table: one row per cell, in the `format` its reader can use; `notes`
    (later runs that measured nothing) follow it, one line each, then with `tally` the
    tally line (`tally_line`; not after a pipe table, which is pasted as it is)."""
    records = list(records)
    rows = verdict_rows(records)
    chosen = table_format(format)
    closing = [*notes, *([tally_line(records)] if tally and chosen != "markdown" else [])]
    if chosen == "rich":
        _rich_table(records, rows)
        for note in closing:
            ui.out.print(Text(note))  # wrapped between words, as the table is
        return
    text = (
        markdown_table(VERDICT_COLUMNS, rows)
        if chosen == "markdown"
        else ("reprobox verdicts\n" + plain_table(VERDICT_COLUMNS, rows))
    )
    _print_plain("\n\n".join([text, *(one_line(note) for note in closing)]))


def tally_line(records: Sequence[Record]) -> str:
    """`11 of 11 verdicts as expected`, or which missed and what they gave: the one line a
    run, a table and `make repro` end with. A cell with no expectation (`unknown`) is counted
    apart: it was measured, not judged."""
    recorded = [r for r in records if r.status == Status.RECORDED]
    judged = [r for r in records if r.status != Status.RECORDED]
    if not records:
        return "no verdicts"
    good = [r for r in judged if r.status == Status.MATCH]
    line = f"{len(good)} of {len(judged)} verdicts as expected"
    if recorded:
        line += f"; {len(recorded)} recorded with no expectation"
    missed = [r for r in judged if r.status != Status.MATCH]
    if missed:
        line += "; missed: " + ", ".join(_missed(r) for r in missed)
    return line


def _missed(record: Record) -> str:
    gave = ui.shown_verdict(record)
    if record.status == Status.MISMATCH and record.verdict == Verdict.CANNOT_TEST:
        gave = "cannot test"  # not a verdict that missed: the cell could not be tested here
    return f"{record.repro} {record.label} gave {gave} (expected {record.expect})"


# ---- a rich table that fits its terminal ---------------------------------------------------


def _rich_table(records: list[Record], rows: list[tuple[str, ...]]) -> None:
    header = list(VERDICT_COLUMNS)
    one_repro = len({r.repro for r in records}) == 1
    keep, widths, footnote = fit_columns(header, rows, ui.out.width, one_repro)
    title = "reprobox verdicts"
    if "repro" not in [header[i] for i in keep] and one_repro:
        title += f": {records[0].repro}"
    table = Table(title=title, show_lines=False)
    for index, width in zip(keep, widths, strict=True):
        table.add_column(
            header[index], width=width, overflow="ellipsis", justify=justify(header[index])
        )
    for record, cells in zip(records, rows, strict=True):
        # Text, not str: a cell's text is data, never markup
        shown = [Text(one_line(cells[i])) for i in keep]
        table.add_row(*shown, style=ui.STATUS_STYLE.get(record.status))
    ui.out.print(table)
    if footnote:
        ui.out.print(Text(footnote))


def fit_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int, one_repro: bool = True
) -> tuple[list[int], list[int], str]:
    """The columns to draw in a `width`-wide box table (their indexes), each one's width, and
    the footnote saying what was dropped or cut ("" when all fit whole).

    A column is given at least its longest word (never a token split) and up to its widest
    cell; the least needed columns (`DROP_ORDER`; the repro only when every row has one
    repro, named in the title then) are dropped until the words fit; if they still do not,
    the cell and decided-by columns are cut with "…"."""
    body = [[one_line(cell) for cell in row] for row in rows]
    columns = list(zip(header, *body, strict=True)) if body else [(h,) for h in header]
    words = [max(_longest_word(cell) for cell in column) for column in columns]
    whole = [max(cell_len(cell) for cell in column) for column in columns]
    keep = list(range(len(header)))
    dropped: list[str] = []

    def room() -> int:  # a box table: a border before each column and after the last, padding 2
        return width - 3 * len(keep) - 1

    for name in DROP_ORDER:
        if sum(words[i] for i in keep) <= room():
            break
        if name not in header or (name == "repro" and not one_repro):
            continue
        index = header.index(name)
        keep.remove(index)
        dropped.append(name)
    given = {i: words[i] for i in keep}
    cut: list[str] = []
    over = sum(given.values()) - room()
    for name in CUTTABLE:  # the last resort: cut the widest of these down, fairly
        if over <= 0:
            break
        if name not in header:
            continue
        index = header.index(name)
        floor = max(cell_len(header[index]), 8)
        take = min(over, given[index] - floor)
        if take > 0:
            given[index] -= take
            over -= take
            cut.append(name)
    spare = room() - sum(given.values())
    while spare > 0:  # the rest goes to the columns short of their widest cell, one at a time
        short = [i for i in keep if given[i] < whole[i]]
        if not short:
            break
        neediest = max(short, key=lambda i: whole[i] - given[i])
        given[neediest] += 1
        spare -= 1
    return keep, [given[i] for i in keep], _footnote(dropped, cut, width)


def _footnote(dropped: list[str], cut: list[str], width: int) -> str:
    if not dropped and not cut:
        return ""
    parts = []
    if dropped:
        parts.append("dropped " + ", ".join(dropped))
    if cut:
        parts.append(" and ".join(cut) + " cut with …")
    return f"({'; '.join(parts)} to fit {width} columns; --format plain shows every column)"


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _print_plain(text: str) -> None:
    """Print as written: no markup, no emoji codes, no wrapping, no colour."""
    ui.out.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
