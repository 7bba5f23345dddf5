"""GitHub-flavoured markdown that cannot be hijacked by the text it quotes.

A report quotes what scripts and machines wrote (reasons, log lines, metric names, versions)
into a comment that `--post` publishes. Read raw, such text pings people (`@octocat`), links
other issues (`#123`), closes the report's own `<details>` early (`</details>`) or hides the
rest of the comment (`<!--`). So text from outside goes in one of three ways only: inside a
code fence or code span (`fence`, `code`: literal there, longer delimiters than any run
inside), as escaped prose (`text`), or as escaped HTML (`html_text`, for `<summary>`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Mentions and references GitHub links in prose: @user, @org/team, #123, GH-123, owner/repo#1.
_MENTION = re.compile(r"@(?=[A-Za-z0-9])")
_REFERENCE = re.compile(r"(#|GH-)(?=\d)", re.IGNORECASE)
# Bare URLs GitHub turns into links: `https://...` and `www....`.
_SCHEME = re.compile(r"(?<=:)(?=//)")
_WWW = re.compile(r"(?i)\b(www)(?=\.)")
_WJ = "\u2060"  # WORD JOINER: invisible, and breaks GitHub's mention / reference patterns
# CommonMark lets any ASCII punctuation be backslash-escaped; these are the ones that start
# markup inside a line (emphasis, code, links, images, tables, strikethrough, autolinks).
_INLINE = re.compile(r"([\\`*_\[\]|~!])")
# Block markers at the start of a line, which need a space (or the end) after them.
_LINE_START = re.compile(r"^(\s*)(#{1,6}|[+-]|\d{1,9}[.)])(?=\s|$)")


def defuse(text: str) -> str:
    """Break mentions, issue references and bare-URL autolinks without changing what a
    reader sees."""
    text = _MENTION.sub("@" + _WJ, text)
    text = _REFERENCE.sub(lambda m: m.group(1) + _WJ, text)
    return _WWW.sub(lambda m: m.group(1) + _WJ, _SCHEME.sub(_WJ, text))


def text(value: object) -> str:
    """Prose from outside, on one line: no markup, no HTML, no mention, no reference."""
    raw = " ".join(str(value).split())
    escaped = html.escape(raw, quote=False)  # & < > : no tag, no comment, no entity
    escaped = _INLINE.sub(r"\\\1", escaped)
    escaped = _LINE_START.sub(_escape_marker, escaped)
    return defuse(escaped)


def _escape_marker(match: re.Match[str]) -> str:
    lead, marker = match.group(1), match.group(2)
    if marker[0].isdigit():  # `1.` -> `1\.`: a backslash before a digit is no escape
        return lead + marker[:-1] + "\\" + marker[-1]
    return lead + "\\" + marker


def html_text(value: object) -> str:
    """Text for inside an HTML element (`<summary>`): escaped, mentions broken."""
    return defuse(html.escape(" ".join(str(value).split())))


def code(value: object) -> str:
    """An inline code span holding `value` literally (newlines become spaces)."""
    raw = " ".join(str(value).split()) or " "
    longest = max((len(m) for m in re.findall(r"`+", raw)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if raw.startswith("`") or raw.endswith("`") else ""
    return f"{ticks}{pad}{raw}{pad}{ticks}"


def html_code(value: object) -> str:
    """`<code>` for inside HTML (a summary line): escaped, mentions broken."""
    return f"<code>{html_text(value)}</code>"


def fence(body: str, lang: str = "") -> str:
    """A code block whose fence is longer than any backtick run inside it: nothing in
    `body` can end it, and nothing in it is markup."""
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{body.rstrip()}\n{ticks}"


def details(summary_html: str, body: str) -> str:
    """A collapsed block; `summary_html` is HTML built with `html_text` / `html_code`.
    The blank lines around the body end the HTML block, so the body is markdown."""
    return f"<details><summary>{summary_html}</summary>\n\n{body.rstrip()}\n\n</details>"


def cell(value: str) -> str:
    """A table cell from markdown already escaped: `|` would split the row (also inside a
    code span, where GFM still reads `\\|` as the pipe)."""
    return re.sub(r"(?<!\\)\|", r"\\|", value.replace("\n", " "))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GFM table of markdown cells (escape outside text with `text` or `code` first)."""
    lines = ["| " + " | ".join(cell(h) for h in header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def link(label: str, url: str) -> str:
    """`[label](url)` with the label escaped and the URL kept to one safe token."""
    safe = re.sub(r"[\s()<>]", lambda m: f"%{ord(m.group()):02X}", url)
    return f"[{text(label)}]({safe})"


def number(value: object) -> str:
    """A metric value, short: 4 significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return f"{value:.4g}"


@dataclass
class Section:
    """A piece of the report; `drop` > 0 may be shortened to fit a comment (highest first)."""

    text: str
    drop: int = 0
    stub: str = ""
    source: Path | None = None  # a repro file shown whole (a maintainer needs it to run)
    shown: str = ""  # its name in the comment (`fixes/x.py`)
    omitted: bool = False  # replaced by its stub to fit the comment
