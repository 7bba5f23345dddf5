"""Sweep: probe every release in a range and map where the variant reproduces.

A bisect assumes one change between its ends; real regressions come back (fixed, regressed,
patched, back again). A sweep assumes nothing: it probes each release once and prints the
affected versions the way advisories do, as ranges (`>=4.44.2,<4.46.0; ==4.47.0`) and
introduced / fixed events, with the releases it could not test listed apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from reprobox.bisect import checks
from reprobox.bisect.answer_line import events_line
from reprobox.bisect.axes import Question
from reprobox.bisect.driver import drive
from reprobox.bisect.outcome import Known, Outcome
from reprobox.bisect.prober import (
    Prober,
    Probes,
    Target,
    overrides_note,
    pin_overrides,
    release_probes,
)
from reprobox.bisect.strategy import BINARY, Strategy
from reprobox.bisect.summary import BisectSummary, Contradiction, Event, ProbeEntry, SweepDetails
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.envs.index import PackageIndex, select


def affected_ranges(
    verdicts: Sequence[tuple[str, Verdict | None]],
) -> tuple[list[str], list[Event], list[str]]:
    """Releases in order with their verdicts (None: untested) as advisory ranges of the
    reproducing ones, introduced / fixed events, and the untested releases.

    A stretch of reproducing releases ends at the next clean one: `>=first,<fixed`, or
    `==first` when it holds one release; a stretch running to the end of the range ends
    `<=last`. An untested release inside a stretch is inside its range (and listed apart).
    An event is a fact only between two adjacent probed releases; at the range's first
    release, or after untested ones, it is a bound (`Event.bound`), and a stretch still open
    at the end is `last_affected`, a bound too: the range cannot see past its edges."""
    names = [name for name, _ in verdicts]
    ranges: list[str] = []
    events: list[Event] = []
    untested = [name for name, verdict in verdicts if verdict is None]
    opened: int | None = None  # index of the first release of the current stretch
    probed: int | None = None  # index of the last release with a verdict
    for index, (name, verdict) in enumerate(verdicts):
        if verdict is None:
            continue
        after = names[probed] if probed is not None else None
        bound = probed != index - 1
        if verdict is Verdict.REPRODUCED and opened is None:
            opened = index
            events.append(Event(introduced=name, bound=bound, after=after))
        elif verdict is Verdict.CLEAN and opened is not None:
            inside = names[opened:index]
            ranges.append(f"=={inside[0]}" if len(inside) == 1 else f">={inside[0]},<{name}")
            events.append(Event(fixed=name, bound=bound, after=after))
            opened = None
        probed = index
    if opened is not None:
        last = max(i for i, (_, v) in enumerate(verdicts) if v is Verdict.REPRODUCED)
        inside = names[opened : last + 1]
        ranges.append(f"=={inside[0]}" if len(inside) == 1 else f">={inside[0]},<={inside[-1]}")
        events.append(Event(last_affected=names[last], bound=True))
    return ranges, events, untested


def sweep(
    target: Target,
    package: str,
    specifier: str,
    index: PackageIndex,
    *,
    strategy: Strategy = BINARY,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
    probes: Probes[str] | None = None,
) -> BisectSummary:
    """Probe every release of `package` in `specifier` (yanked ones too, marked), the
    strategy's `workers` at a time (a sweep maps: it never searches)."""
    target, axis = sweep_axis(target, package, specifier, index, probes)
    mapping = Strategy(workers=strategy.workers, mapping=True)
    return drive(target, axis, mapping, log_path=log_path, on_probe=on_probe)


@dataclass(frozen=True)
class SweepAxis:
    """The releases of one package in a range, each probed once, and the map they make."""

    question: Question[str]
    target: Target  # its overrides pinned to one commit each
    package: str
    fake: Probes[str] | None = None  # tests: probes that stand for the real runs

    def name(self, item: str) -> str:
        return item

    def probes(self, runs: Path) -> Probes[str]:
        return (
            self.fake if self.fake is not None else release_probes(self.target, self.package, runs)
        )

    def refine(
        self, outcome: Outcome[str], prober: Prober[str], strategy: Strategy
    ) -> Outcome[str]:
        """The map: affected ranges, events and untested releases, and the verdicts on disk
        that disagree with a release's probe."""
        ranges, events, untested = affected_ranges(outcome.verdicts)
        disagree, agreeing = disagreements(outcome.verdicts, outcome.on_disk)
        asked = self.question.asked.details
        assert isinstance(asked, SweepDetails)
        the_map = asked.model_copy(
            update={"affected": "; ".join(ranges), "events": events, "untested": untested}
        )
        return replace(outcome, details=the_map, found=tuple(disagree), agreeing=agreeing)

    def answer(self, summary: BisectSummary, outcome: Outcome[str]) -> str:
        the_map = summary.details
        assert isinstance(the_map, SweepDetails)
        stretches = len(the_map.affected.split("; ")) if the_map.affected else 0
        return sweep_sentence(summary, stretches, outcome.unread)


def sweep_axis(
    target: Target,
    package: str,
    specifier: str,
    index: PackageIndex,
    probes: Probes[str] | None = None,
) -> tuple[Target, SweepAxis]:
    """The sweep axis of `package` over `specifier`, and the target every probe runs."""
    repro, platform = target.repro, target.options.platform
    name = repro.check_pinned(package, "--package")
    target = pin_overrides(target, [name])  # every probe: the same commit of each source
    releases = index.releases(package)
    chosen = select(releases, specifier, include_yanked=True)
    if not chosen:
        raise BadInput(f"no release of {name} matches {specifier!r}")
    versions = [str(v) for v in chosen]
    yanked = sorted(
        {str(r.version) for r in releases if r.yanked} & set(versions), key=versions.index
    )
    header = {
        "kind": "sweep", "repro": repro.name, "variant": target.variant, "package": name,
        "range": specifier, "platform": platform, "versions": versions, **target.header(),
    }  # fmt: skip
    question = Question(
        noun="release", candidates=versions, header=header,
        asked=BisectSummary.model_validate({**header, "yanked": yanked}), names=tuple(versions),
    )  # fmt: skip
    return target, SweepAxis(question, target, package, probes)


def disagreements(
    verdicts: Sequence[tuple[str, Verdict | None]], on_disk: Sequence[Known]
) -> tuple[list[Contradiction], int]:
    """Verdicts on disk about a release the sweep measured otherwise, and how many agree."""
    mine = {Version(name): verdict for name, verdict in verdicts if verdict is not None}
    against: list[Contradiction] = []
    agreeing = 0
    for item, verdict, source in on_disk:
        try:
            measured = mine.get(Version(item))
        except InvalidVersion:
            continue
        if measured is None:
            continue
        if measured is verdict:
            agreeing += 1
        else:
            against.append(
                Contradiction(item=item, verdict=verdict, expected=measured, source=source)
            )
    return checks.unique(against), agreeing


def sweep_sentence(summary: BisectSummary, stretches: int, unread: str = "") -> str:
    """The line a sweep ends with: the affected ranges, or that nothing reproduces; a
    verdict on disk against a release's probe makes the map uncertain, said so."""
    the_map = summary.details
    assert isinstance(the_map, SweepDetails), "a sweep's summary"
    probed = len(summary.versions) - len(the_map.untested)
    counts = f"{probed} of {len(summary.versions)} releases tested"
    counts += overrides_note(summary.overrides, summary.override_commits)
    if summary.contradictions:
        listed = ", ".join(
            f"{c.item} {'is clean' if c.verdict is Verdict.CLEAN else 'reproduces'} ({c.source})"
            for c in summary.contradictions
        )
        counts += f"; verdicts on disk disagree: {listed}, so the map is not certain"
    elif summary.agreeing:
        counts += f"; {summary.agreeing} verdict(s) on disk agree"
    if unread:
        counts += f"; {unread}"
    if the_map.untested:
        counts += f"; untested: {', '.join(the_map.untested)}"
    if not the_map.affected:
        return f"no release of {the_map.package} in {the_map.range} reproduces ({counts})"
    changed = sum(1 for e in the_map.events if e.last_affected is None)
    changes = (
        f"; the verdict changes {changed} times: a bisect of this range would not be certain"
        if stretches > 1
        else ""
    )
    bounds = events_line([e for e in the_map.events if e.bound], summary.versions)
    edges = f"; {bounds}" if bounds else ""
    return f"{the_map.package} affected: {the_map.affected} ({counts}{edges}{changes})"
