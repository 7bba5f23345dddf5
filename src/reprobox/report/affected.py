"""What the report may say about which releases are affected, from every verdict on disk.

A sweep maps releases; a release bisect probes some; the matrix and default cells measure
others. The report's "Affected" line merges them all for one configuration (package, variant,
platform, the other packages fixed with `--with`), so a narrower newer sweep never replaces a
wider one and the line never contradicts a verdict the report shows. Pure: no formatting.

Range edges are bounds: an event is only claimed between two probed releases with no release
between them; otherwise the line says "at or before" / "after", and a release measured both
ways is named and claims nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from reprobox.bisect.summary import BisectSummary, SweepDetails
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record

Config = tuple[str, str, str, tuple[tuple[str, str], ...]]  # package, variant, platform, --with


@dataclass(frozen=True)
class Seen:
    """One measured verdict of one release, and where it was measured."""

    release: str
    verdict: Verdict
    source: str  # "sweep <id>", "bisect <id>", "cell <label>"


@dataclass(frozen=True)
class Edge:
    """One side of an affected run: exact (between two adjacent probed releases) or a bound."""

    kind: str  # "introduced" | "fixed"
    at: str | None  # the release the event happened in, when exact
    after: str | None  # the last probed release before the change (None: the range's edge)
    before: str | None  # the first probed release after it (None: the range's edge)
    first_of_range: bool = False  # the bound is the first (or last) release known in the range


@dataclass(frozen=True)
class Span:
    """Consecutive probed releases that all reproduce, with what is known at both ends."""

    first: str
    last: str
    start: Edge
    end: Edge


@dataclass
class ReleaseMap:
    """Every verdict on disk of one configuration, over every release known in its range."""

    config: Config
    releases: list[str]  # every release known in the range, oldest first
    seen: dict[str, list[Seen]] = field(default_factory=dict)  # release -> its verdicts
    sources: dict[str, int] = field(default_factory=dict)  # "sweep" / "bisect" / "cell" -> n
    untested: list[str] = field(default_factory=list)  # releases a sweep could not test

    @property
    def package(self) -> str:
        return self.config[0]

    def verdict(self, release: str) -> Verdict | None:
        """The release's verdict when every measurement agrees, else None."""
        found = {s.verdict for s in self.seen.get(release, [])}
        return found.pop() if len(found) == 1 else None

    def conflicts(self) -> dict[str, list[Seen]]:
        """Releases measured both ways: no event is claimed next to them."""
        return {r: s for r, s in self.seen.items() if len({x.verdict for x in s}) > 1}

    def probed(self) -> list[str]:
        """Releases with one agreed verdict, oldest first."""
        return [r for r in self.releases if self.verdict(r) is not None]

    def spans(self) -> list[Span]:
        """The affected runs over the probed releases, each edge an event or a bound."""
        probed = self.probed()
        spans: list[Span] = []
        index = 0
        while index < len(probed):
            if self.verdict(probed[index]) is not Verdict.REPRODUCED:
                index += 1
                continue
            start = index
            while index + 1 < len(probed) and self.verdict(probed[index + 1]) is Verdict.REPRODUCED:
                index += 1
            before = probed[start - 1] if start > 0 else None
            after = probed[index + 1] if index + 1 < len(probed) else None
            spans.append(
                Span(
                    probed[start],
                    probed[index],
                    self._edge("introduced", before, probed[start]),
                    self._edge("fixed", probed[index], after),
                )
            )
            index += 1
        return spans

    def _edge(self, kind: str, older: str | None, newer: str | None) -> Edge:
        """The change between two probed releases: exact when nothing is known between."""
        if older is None or newer is None:
            return Edge(kind, None, older, newer, first_of_range=self._at_range_edge(older, newer))
        between = self._between(older, newer)
        return Edge(kind, None if between else newer, older, newer)

    def _between(self, older: str, newer: str) -> list[str]:
        lo, hi = self.releases.index(older), self.releases.index(newer)
        return self.releases[lo + 1 : hi]

    def _at_range_edge(self, older: str | None, newer: str | None) -> bool:
        edge = self.releases[0] if older is None else self.releases[-1]
        return (newer if older is None else older) == edge


def configs(summaries: Iterable[BisectSummary]) -> list[Config]:
    """The configurations that have a sweep, newest sweep first."""
    return list(dict.fromkeys(config_of(s) for s in summaries if s.kind == "sweep" and s.package))


def config_of(summary: BisectSummary) -> Config:
    others = tuple(sorted((canonicalize_name(k), v) for k, v in summary.overrides.items()))
    return (canonicalize_name(summary.package or ""), summary.variant, summary.platform, others)


def release_map(
    config: Config, summaries: Sequence[BisectSummary], records: Sequence[Record]
) -> ReleaseMap:
    """Every sweep's and release bisect's probes and every measured cell of `config` (the
    same variant and platform, the package at one release, the other packages as `--with`
    fixed them), merged over the union of the releases they know."""
    package, variant, platform, others = config
    known: dict[Version, str] = {}
    found = ReleaseMap(config, [])

    def add(release: str, verdict: str | None, source: str) -> None:
        key = _version(release)
        if key is None or verdict not in (Verdict.CLEAN.value, Verdict.REPRODUCED.value):
            return
        name = known.setdefault(key, release)
        found.seen.setdefault(name, []).append(Seen(name, Verdict(verdict), source))

    for summary in summaries:
        if summary.kind not in ("sweep", "release") or config_of(summary) != config:
            continue
        kind = "sweep" if summary.kind == "sweep" else "bisect"
        found.sources[kind] = found.sources.get(kind, 0) + 1
        for release in summary.versions:
            if (key := _version(release)) is not None:
                known.setdefault(key, release)
        if isinstance(summary.details, SweepDetails):
            found.untested += [u for u in summary.details.untested if u not in found.untested]
        for probe in summary.probes:
            add(probe.item, probe.verdict, f"{kind} {summary.id or summary.summary_path}")
    for record in records:
        ran = _release_of(record, package, variant, platform, dict(others))
        if ran is not None:
            found.sources["cell"] = found.sources.get("cell", 0) + 1
            add(ran, record.verdict, f"cell {record.label}")
    found.releases = [known[k] for k in sorted(known)]
    found.untested = [u for u in found.untested if found.verdict(u) is None]
    return found


def measured_releases(
    summary: BisectSummary, records: Sequence[Record]
) -> list[tuple[str, Verdict, Record]]:
    """The measured cells of a release bisect's or sweep's configuration (`config_of`), each
    with the release it ran and its verdict: what the report shows beside the answer."""
    package, variant, platform, others = config_of(summary)
    found: list[tuple[str, Verdict, Record]] = []
    for record in records:
        ran = _release_of(record, package, variant, platform, dict(others))
        if ran is not None and record.verdict in (Verdict.CLEAN.value, Verdict.REPRODUCED.value):
            public = _version(ran)  # `2.1.0+cpu` as imported is the release 2.1.0
            found.append((str(public) if public else ran, Verdict(record.verdict), record))
    return found


def _release_of(
    record: Record, package: str, variant: str, platform: str, others: Mapping[str, str]
) -> str | None:
    """The release of `package` a measured cell of the configuration ran (as imported)."""
    if record.variant != variant or record.platform != platform or record.params:
        return None
    if record.status not in (Status.MATCH, Status.MISMATCH):
        return None
    pinned: dict[str, str] = {canonicalize_name(k): v for k, v in record.packages.items()}
    if {k: v for k, v in pinned.items() if k != package} != dict(others):
        return None
    imported = record.result.get("versions")
    if isinstance(imported, dict):
        for name, version in imported.items():
            if canonicalize_name(str(name)) == package:
                return str(version)
    return pinned.get(package)


def version_key(text: str) -> Version | str:
    """A release as compared (`_version`), or its text when it is no version."""
    return _version(text) or text


def _version(text: str) -> Version | None:
    """A release as compared: its public version (a local `+cpu` tag is the same release)."""
    try:
        return Version(Version(text).public)
    except InvalidVersion:
        return None
