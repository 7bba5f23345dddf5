"""What a person sees: one line per cell, a verdict table, progress while cells run.

rich draws the progress and tables in a terminal; under CI or without a TTY the same
information comes as plain lines and a plain table sized to its content, so logs stay
readable. Text from records and repro.toml (labels, reasons, titles) is data: it is never
read as rich markup or emoji codes, so `broken[transformers=4.44.2]` keeps its version and a
reason holding `[/path]` prints as written. This module imports only `core` (and rich);
progress lines live in `cli.progress`, tables in `cli.table_drawing` (both named here too).
"""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from reprobox.cli.columns import plain_table
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record
from reprobox.core.scrub import Scrubber
from reprobox.core.settings import Settings

if TYPE_CHECKING:
    from reprobox.bisect.summary import BisectSummary

# a message stays one line; no `:name:` emoji codes replaced in messages
console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
out = Console(highlight=False, emoji=False)

STATUS_STYLE = {"match": "green", "mismatch": "bold red", "recorded": "cyan", "error": "red"}
STATUS_STYLE["undecided"] = "yellow"


_ci = bool(os.environ.get("CI"))  # until `configure` is told (the CLI does, at its edge)
_heartbeat_s = Settings.heartbeat_s


def configure(settings: Settings) -> None:
    """Take the process's settings (under CI: plain lines, no live progress, heartbeats)."""
    global _ci, _heartbeat_s
    _ci, _heartbeat_s = settings.ci, settings.heartbeat_s


def ci() -> bool:
    return _ci


def heartbeat_s() -> float:
    """Seconds without output after which a phase says it is still under way."""
    return _heartbeat_s


def interactive() -> bool:
    """Live progress only for a person at a terminal, never in CI logs."""
    return console.is_terminal and not _ci


def plain(text: str) -> str:
    """A line as the terminal shows it: no secret (CI logs are read by many) and the home
    folder as `~` (a capture of the terminal is pasted into issues; `~/x` still opens)."""
    return Scrubber().text(text)


def error(message: str) -> None:
    """The one error line, as `plain`."""
    console.print(f"reprobox: error: {plain(message)}", style="red", markup=False)


def info(message: str) -> None:
    console.print(plain(message), markup=False)


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
    line = plain(line)
    if console.is_terminal:  # the terminal would cut a word where the line meets its edge
        line = words_to_width(line, console.width)
    console.print(line, style=STATUS_STYLE.get(record.status), markup=False)


def words_to_width(line: str, width: int) -> str:
    """`line` broken between words to `width` columns, the rest indented: a token longer
    than the width (a path) stays whole on a line of its own."""
    return textwrap.fill(
        line,
        width=max(width, 20),
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def bisect_summary(summary: BisectSummary) -> None:
    """The closing line, as `git bisect` ends, and where the details are."""
    info(
        f"{summary.distinct_probed} probed, {summary.launched} launched "
        f"({summary.skips} skipped, {summary.wall_s:.0f}s); summary: {summary.summary_path}"
    )
    # one wording of events and bounds; start-up cost: a bisect's summary only
    from reprobox.bisect.answer_line import events_line
    from reprobox.bisect.summary import SweepDetails

    if isinstance(summary.details, SweepDetails) and summary.details.events:
        info(f"events: {events_line(summary.details.events, summary.versions)}")
    out.print(summary.result, markup=False, soft_wrap=True)  # one line, however long


def shown_verdict(record: Record) -> str:
    """A record's verdict in words: "undecided" for a noisy cell its launches left open."""
    return record.verdict or ("undecided" if record.status == "undecided" else "error")


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
        if variant["test_text"]:
            lines.append(f"      {variant['test_text']}")
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
