"""Text tables sized to their content: a plain one (columns padded to their widest cell, one
line per row, for CI logs, pipes, files and `reprobox list`) and a GitHub pipe table for a
comment. Pure text, no console: `cli.table_drawing` and `cli.ui` both draw through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from rich.cells import cell_len


def plain_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart: one line per row, whatever the
    terminal width, so no word is ever split."""
    body = [[one_line(cell) for cell in row] for row in rows]
    widths, right = _widths(header, body), [justify(h) == "right" for h in header]
    lines = [header, ["-" * width for width in widths], *body]
    return "\n".join(_join(line, widths, right, "  ").rstrip() for line in lines)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub pipe table sized to its content: aligned as text, rendered in a comment."""
    body = [[one_line(cell).replace("|", "\\|") for cell in row] for row in rows]
    widths, right = _widths(header, body), [justify(h) == "right" for h in header]
    rule = ["-" * (w - 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True)]
    lines = [header, rule, *body]
    return "\n".join(f"| {_join(line, widths, right, ' | ')} |" for line in lines)


def one_line(text: str) -> str:
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


def justify(column: str) -> Literal["left", "right"]:
    return "right" if column == "wall s" else "left"
