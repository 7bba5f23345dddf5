"""What a report is built from: the newest measured record of every cell (and the later runs
that measured nothing, listed beside it, never in its place), the bisect and sweep
summaries beside them, and the choice of cells a reader asked for (`--only`, `--since`).

Cells that never produced a verdict because they never ran (bad input, an install that
failed, an interrupt before the launch) are told apart here, once, so no section counts them
against the repro.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprobox.bisect.summary import BisectSummary, read_summaries
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import ForeignRecord, Record, RecordStore
from reprobox.report.metric_text import is_total

BISECT_DIR = "_bisect"
EXTRA_METRICS = 3  # headline metrics shown beside the ones the verdict rule reads
# Harness exit codes of a cell that was never launched (or never finished installing).
_NOT_RUN = {
    ExitCode.BAD_INPUT,
    ExitCode.ENV_FAILED,
    ExitCode.NO_ENGINE,
    ExitCode.INTEGRITY,
    ExitCode.HANGUP,
    ExitCode.INTERRUPTED,
    ExitCode.TERMINATED,
}


class ReportError(BadInput):
    """The records cannot make a report (none, foreign, unreadable) or the output is unsafe."""


@dataclass
class Loaded:
    records: list[Record]
    skipped: list[str] = field(default_factory=list)  # "path: why", one per unusable file
    left_out: int = 0  # cells --only / --since left out
    # runs newer than their cell's measured record that measured nothing (interrupted,
    # errored, never launched): listed with their time, never the cell's verdict
    later: list[Record] = field(default_factory=list)


@dataclass(frozen=True)
class Selection:
    """Which cells a report shows: labels or variants matching `only` (shell patterns), and
    records started at or after `since` (UTC). Empty: all."""

    only: tuple[str, ...] = ()
    since: datetime | None = None

    def keeps(self, record: Record) -> bool:
        if self.only and not any(
            fnmatch.fnmatchcase(name, pattern)
            for pattern in self.only
            for name in (record.label, record.variant)
        ):
            return False
        if self.since is not None:
            started = parse_utc(record.started_at)
            if started is None or started < self.since:
                return False
        return True


def parse_utc(text: str) -> datetime | None:
    """`2026-11-30T00:00:00Z` (or a date) -> an aware datetime; None when unreadable."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_since(text: str) -> datetime:
    """`--since` as a UTC instant: an ISO date or date-time."""
    value = parse_utc(text.strip())
    if value is None:
        raise ReportError(f"--since {text!r}: expected a date such as 2026-11-30 (UTC)")
    return value


def not_run(record: Record) -> bool:
    """A cell with no verdict because it never ran: bad input, an environment that could
    not be installed, an interrupt before its launch. Not evidence about the bug."""
    if record.verdict is not None:
        return False
    return record.exit_code in _NOT_RUN or not (record.command or record.exits)


def load_records(
    store: RecordStore, name: str, selection: Selection = Selection(), *, answers: int = 0
) -> Loaded:
    """The newest measured record of every cell of `name`, by the store's one rule (the
    table shows the same ones), less the cells `selection` leaves out.

    A half-written record is skipped for the next older run of its cell, and named in the
    report; a record of another repro under this repro's folder is an error. With no cell
    on disk, `answers` (the sweeps and bisects on disk) make a report of their own: none
    is loaded, never an error."""
    base = store.repro_dir(name)
    if not base.is_dir():
        raise ReportError(f"no results for {name} under {base}; run `reprobox run {name}` first")
    try:
        cells, skipped = store.histories(name)
    except ForeignRecord as exc:
        raise ReportError(str(exc)) from None
    records = [h.record for h in cells]
    if not records and answers:
        return Loaded([], skipped)
    if not records:
        extra = f" ({len(skipped)} unreadable)" if skipped else ""
        raise ReportError(f"no usable records for {name} under {base}{extra}")
    kept = [r for r in records if selection.keeps(r)]
    later = [run for h in cells if any(h.record is r for r in kept) for run in h.unmeasured]
    if not kept:
        raise ReportError(
            f"--only / --since leave none of the {len(records)} cells of {name}; "
            f"the cells are: {', '.join(r.label for r in records)}"
        )
    return Loaded(kept, skipped, left_out=len(records) - len(kept), later=later)


Finite = Annotated[float, Field(allow_inf_nan=False)]


class MeasureRow(BaseModel):
    """One group (a rank, or all of them) of a recorded measurement."""

    model_config = ConfigDict(extra="ignore")

    group: str
    n: Annotated[int, Field(ge=0)]
    mean: Finite
    se: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    fraction_negative: Annotated[float, Field(ge=0, le=1)]
    z: Finite


class Measurement(BaseModel):
    """What a cell expected `unknown` measured, as its script states it (`measurement` in
    the result, see repros/README.md): figures per group and the script's own conclusion."""

    model_config = ConfigDict(extra="ignore")

    name: str = ""
    rows: Annotated[list[MeasureRow], Field(min_length=1)]
    conclusion: str


def measurement(record: Record) -> Measurement | None:
    """The measurement a recorded cell (expect `unknown`) wrote, or None: a cell that is
    judged, or whose result has none or a malformed one, is shown as a verdict instead."""
    if record.status != Status.RECORDED:
        return None
    found = record.result.get("measurement")
    if not isinstance(found, dict):
        return None
    try:
        return Measurement.model_validate(found)
    except ValidationError:
        return None


def bisect_summaries(store: RecordStore, name: str) -> tuple[list[BisectSummary], list[str]]:
    """Every `_bisect/*/summary.json` of `name`, newest first, and the unreadable ones
    (read through the bisect's own model, so the report and the bisect agree on fields)."""
    return read_summaries(store.repro_dir(name) / BISECT_DIR)


def order_records(records: Sequence[Record], variants: Sequence[str]) -> list[Record]:
    """Default cells first in repro.toml's variant order, then the matrix, then platform."""
    rank = {v: i for i, v in enumerate(variants)}

    def key(r: Record) -> tuple[bool, int, str, str, str, str]:
        axes = bool(r.packages or r.params)
        return (
            axes,
            rank.get(r.variant, len(rank)),
            r.variant,
            str(r.packages),
            str(r.params),
            r.platform,
        )

    return sorted(records, key=key)


def key_metrics(records: Sequence[Record], rule_metrics: Sequence[str]) -> list[str]:
    """The rule's metrics, then up to EXTRA_METRICS headline ones: metrics whose values
    separate reproduced from clean runs first, then any that vary; constants never."""
    rules = list(dict.fromkeys(rule_metrics))
    names = [m for r in records for m in r.metrics if m not in rules]
    names = [m for m in names if not is_total(m, names + rules)]  # shown with its count
    separating, varying = [], []
    for name in dict.fromkeys(names):
        values = [(r.verdict, r.metrics[name]) for r in records if name in r.metrics]
        if len({v for _, v in values}) < 2:
            continue
        hit = [v for verdict, v in values if verdict == Verdict.REPRODUCED]
        clean = [v for verdict, v in values if verdict == Verdict.CLEAN]
        if hit and clean and (min(hit) > max(clean) or max(hit) < min(clean)):
            separating.append(name)
        else:
            varying.append(name)
    return rules + (separating + varying)[:EXTRA_METRICS]


def charted_metrics(metrics: Sequence[str], rule_metrics: Sequence[str]) -> list[str]:
    """The bar charts: the rule's first metric (it decides), and the first headline one
    (often the readable one, e.g. lm_head / mean)."""
    extra = [m for m in metrics if m not in rule_metrics]
    return list(dict.fromkeys([*list(rule_metrics)[:1], *extra[:1]]))
