"""Date bisection: which day's resolution flips the verdict, and which package change does it.

Each day's probe resolves the floated packages as of the end of that day in UTC: uv gets an
exact instant (`NAME=<next day>T00:00:00Z`), never a bare date, which uv reads as the end of
the day in the host's time zone. The first day whose resolution flips the verdict is named
with the releases uploaded on it; then the difference between the day before's resolution and
that day's is delta-debugged to the package(s) that flip it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from reprobox.bisect.axes import Question, plain_answer
from reprobox.bisect.driver import drive
from reprobox.bisect.outcome import Outcome
from reprobox.bisect.prober import Prober, Probes, Target, pin_overrides, pipeline_probes
from reprobox.bisect.search import ddmin
from reprobox.bisect.strategy import BINARY, Strategy
from reprobox.bisect.summary import BisectSummary, DateDetails, ProbeEntry
from reprobox.core.cells import Cell, make_cell
from reprobox.core.errors import BadInput
from reprobox.envs import locks
from reprobox.envs.index import PackageIndex
from reprobox.run import pipeline


@dataclass(frozen=True)
class ChangeSet:
    """A delta-debugging step: the day before's versions with `names` taken from the day."""

    names: tuple[str, ...]
    pins: tuple[tuple[str, str], ...]


DateItem = date | ChangeSet
RequestOf = Callable[[DateItem], locks.LockRequest]


def parse_dates(text: str) -> tuple[date, date]:
    """`START..END` as two days (UTC days: see the module docstring)."""
    try:
        start_text, end_text = text.split("..")
        start, end = date.fromisoformat(start_text), date.fromisoformat(end_text)
    except ValueError:
        raise BadInput(f"--by-date {text!r}: want START..END as YYYY-MM-DD..YYYY-MM-DD") from None
    if start >= end:
        raise BadInput(f"--by-date {text!r}: START must be before END")
    return start, end


def day_start(day: date) -> datetime:
    """The instant a UTC day begins."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def cutoff(day: date) -> str:
    """The instant uv excludes from: everything uploaded on `day` (UTC) counts, nothing later."""
    return day_start(day + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_of_request(
    repro_request: locks.LockRequest, floated: set[str], day: date
) -> locks.LockRequest:
    """The repro's request with the floated packages unpinned and resolved as of `day`."""
    requirements = []
    for pin in repro_request.requirements:
        name = canonicalize_name(Requirement(pin).name)
        requirements.append(name if name in floated else pin)
    instant = cutoff(day)
    kept = [(n, d) for n, d in repro_request.exclude_newer_packages if n not in floated]
    return dataclasses.replace(
        repro_request,
        requirements=tuple(requirements),
        exclude_newer_packages=tuple(sorted([*kept, *((n, instant) for n in floated)])),
    )


def pinned_request(repro_request: locks.LockRequest, change: ChangeSet) -> locks.LockRequest:
    """Exactly the given versions (a delta-debugging step between two resolutions); a
    package the request takes from a built wheel (`--with NAME@git+...`) keeps that wheel,
    not a release of the wheel's version."""
    wheels = {
        canonicalize_name(req.name): text
        for text in repro_request.requirements
        if (req := Requirement(text)).url
    }
    pins = [
        f"{name}=={version}"
        for name, version in change.pins
        if version and canonicalize_name(name) not in wheels
    ]
    return dataclasses.replace(
        repro_request,
        requirements=(*pins, *wheels.values()),
        exclude_newer_packages=(),
    )


def released_on(index: PackageIndex, packages: Sequence[str], day: date) -> list[str]:
    """The releases of `packages` uploaded on `day` (UTC), with their upload times."""
    begin, end = day_start(day), day_start(day + timedelta(days=1))
    found: list[tuple[datetime, str]] = []
    for package in packages:
        for release in index.releases(package):
            uploaded = release.uploaded
            if uploaded is None:
                continue
            if uploaded.tzinfo is None:
                uploaded = uploaded.replace(tzinfo=UTC)  # the index speaks UTC
            if begin <= uploaded < end:
                when = uploaded.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
                found.append((uploaded, f"{package} {release.version} at {when} UTC"))
    return [text for _, text in sorted(found)]


def describe(item: DateItem) -> str:
    return str(item) if isinstance(item, date) else "changes:" + ",".join(item.names)


def date_bisect(
    target: Target,
    start: date,
    end: date,
    floats: Sequence[str],
    *,
    index: PackageIndex | None = None,
    strategy: Strategy = BINARY,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
    probes_for: Callable[[RequestOf], Probes[DateItem]] | None = None,
) -> BisectSummary:
    """Which UTC day's resolution flips the verdict, and which package change does it.

    `index` names the releases uploaded on the answer day; `probes_for` builds the probes
    from the lock request of each item (tests inject fakes that resolve by it). A
    flake-aware `strategy` names the day, not the package change (delta debugging trusts
    single probes)."""
    target, axis = date_axis(target, start, end, floats, index=index, probes_for=probes_for)
    return drive(target, axis, strategy, log_path=log_path, on_probe=on_probe)


@dataclass(frozen=True)
class DateAxis:
    """The UTC days of a range, each a probe of the floated packages resolved as of the end
    of that day; the answer day is named with its uploads and delta-debugged to the
    package change that flips it."""

    question: Question[DateItem]
    target: Target  # its overrides pinned to one commit each
    base: locks.LockRequest  # the repro's own request, before any package floats
    floated: frozenset[str]
    index: PackageIndex | None = None
    fake: Callable[[RequestOf], Probes[DateItem]] | None = None  # tests: probes by request

    def name(self, item: DateItem) -> str:
        return describe(item)

    def request(self, item: DateItem) -> locks.LockRequest:
        """The lock request of a day (resolved as of its end) or of a delta-debugging step."""
        if isinstance(item, date):
            return as_of_request(self.base, set(self.floated), item)
        return pinned_request(self.base, item)

    def probes(self, runs: Path) -> Probes[DateItem]:
        if self.fake is not None:
            probes = self.fake(self.request)
        else:
            target = self.target

            def lock_of(item: DateItem) -> Path:
                return locks.cached_lock(self.request(item), target.settings)

            def cell_of(item: DateItem) -> Cell:
                return make_cell(
                    target.repro, target.variant, target.packages(), None,
                    target.options.platform,
                )  # fmt: skip

            probes = pipeline_probes(target, lock_of, cell_of, runs)
        if probes.versions is None:
            raise BadInput("date bisect probes must list each item's versions")
        return probes

    def refine(
        self, outcome: Outcome[DateItem], prober: Prober[DateItem], strategy: Strategy
    ) -> Outcome[DateItem]:
        """The uploads of the answer day, and the package change that flips the verdict."""
        result = outcome.result
        assert result is not None
        versions_of = prober.probes.versions
        assert versions_of is not None
        before, after = versions_of(result.last_start), versions_of(result.first_end)
        changes = sorted(n for n in {*before, *after} if before.get(n) != after.get(n))
        culprit: list[str] = []
        if result.status == "found" and not outcome.found and changes:

            def flips(subset: list[str]) -> bool | None:
                pins = {**before, **{n: after.get(n, "") for n in subset}}
                item = ChangeSet(tuple(sorted(subset)), tuple(sorted(pins.items())))
                verdict = prober(item, 1)
                return None if verdict is None else verdict is result.end_verdict

            culprit = ddmin(changes, flips)
        start = self.question.candidates[0]
        assert isinstance(start, date)
        first_day = result.first_end if isinstance(result.first_end, date) else start
        asked = self.question.asked.details
        assert isinstance(asked, DateDetails)
        found = asked.model_copy(
            update={
                "released_on_day": released_on(self.index, sorted(self.floated), first_day)
                if self.index is not None
                else [],
                "changes": [_change(n, before, after) for n in changes],
                "culprit": [_change(n, before, after) for n in culprit],
            }
        )
        return replace(outcome, details=found)

    def answer(self, summary: BisectSummary, outcome: Outcome[DateItem]) -> str:
        day = summary.details
        assert isinstance(day, DateDetails), "a date bisect's summary"
        detail = ""
        if summary.status == "found":
            new = day.released_on_day
            named = "; ".join(new) if new else f"no release of {', '.join(sorted(self.floated))}"
            detail = f"UTC; new that day: {named}"
        line = plain_answer(self.question, summary, detail=detail)
        if summary.status == "found":
            line += "; culprit: " + (
                ", ".join(day.culprit)
                if day.culprit
                else "none (the two resolutions do not differ)"
            )
        return line


def date_axis(
    target: Target,
    start: date,
    end: date,
    floats: Sequence[str],
    *,
    index: PackageIndex | None = None,
    probes_for: Callable[[RequestOf], Probes[DateItem]] | None = None,
) -> tuple[Target, DateAxis]:
    """The date axis from `start` to `end` floating `floats`, and the target every probe
    runs (its overrides pinned to one commit each)."""
    repro, platform = target.repro, target.options.platform
    if not floats:
        raise BadInput("a date bisect needs packages to float (--float, or [bisect] package)")
    for name in floats:
        repro.check_pinned(name, "--float")
    floated = {str(canonicalize_name(f)) for f in floats}
    days: list[DateItem] = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    target = pin_overrides(target, floated)  # every probe: the same commit of each source
    header: dict[str, Any] = {
        "kind": "date", "repro": repro.name, "variant": target.variant, "start": str(start),
        "end": str(end), "float": sorted(floated), "platform": platform, "days": "utc",
        **target.header(),
    }  # fmt: skip
    asked = BisectSummary.model_validate({
        "kind": "date", "repro": header["repro"], "variant": header["variant"],
        "platform": header["platform"], "start": header["start"], "end": header["end"],
        "floated": header["float"], "versions": [str(d) for d in days], **target.header(),
    })  # fmt: skip
    wheels, _ = pipeline.resolve_sources(dict(target.overrides), target.settings)
    base = pipeline.lock_request(repro, target.variant, platform, wheels)
    question: Question[DateItem] = Question(
        noun="day", word="date", candidates=days, header=header, asked=asked,
        names=tuple(describe(d) for d in days), flags=("start", "end"),
        came_and_went=f"; the change may have come and gone inside the range: {SAME_ENDS}",
        ends_advice=f"; {SAME_ENDS}", note=target.note(),
        suggest="; bisect the releases of a floated package with `reprobox sweep`",
    )  # fmt: skip
    return target, DateAxis(question, target, base, frozenset(floated), index, probes_for)


SAME_ENDS = "bisect a shorter range, or map a floated package's releases with `reprobox sweep`"


def _change(name: str, before: dict[str, str], after: dict[str, str]) -> str:
    return f"{name} {before.get(name, '(none)')} -> {after.get(name, '(none)')}"
