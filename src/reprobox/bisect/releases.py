"""Release bisection: which release of one package flips a variant's verdict.

Yanked releases are candidates too (they install by exact pin, and a boundary at one is worth
knowing), marked as such. The answer says what it assumed (one change between the ends) and is
checked, before it is printed, against extra probes spread over each side (`verify`) and
every verdict already on disk for the range: matrix records and earlier bisects or sweeps.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from reprobox.bisect.axes import Question, plain_answer
from reprobox.bisect.driver import drive
from reprobox.bisect.outcome import Outcome
from reprobox.bisect.prober import Prober, Probes, Target, pin_overrides, release_probes
from reprobox.bisect.strategy import BINARY, Strategy
from reprobox.bisect.summary import BisectSummary, ProbeEntry
from reprobox.core.errors import BadInput
from reprobox.envs.index import PackageIndex, Release, select


def release_range(
    index: PackageIndex, package: str, good: str, bad: str, *, prereleases: bool = False
) -> list[str]:
    """The releases from the older to the newer endpoint, oldest first, endpoints included;
    yanked releases in, pre-releases out unless asked."""
    releases = _range_releases(index.releases(package), package, good, bad, prereleases)
    return [str(r.version) for r in releases]


def _range_releases(
    releases: list[Release], package: str, good: str, bad: str, prereleases: bool = False
) -> list[Release]:
    if Version(good) == Version(bad):
        raise BadInput(f"--good and --bad are the same release ({good}): nothing to bisect")
    by_version = {r.version: r for r in releases}
    for end, value in (("--good", good), ("--bad", bad)):
        if Version(value) not in by_version:
            raise BadInput(f"{end} {package} {value} does not exist on the index")
    lo, hi = sorted([Version(good), Version(bad)])
    if prereleases:  # by order alone: PEP 440's `<5.0.0` leaves out 5.0.0's own rc's
        inside = sorted(v for v in by_version if lo < v < hi)
    else:
        inside = select(releases, f">{lo},<{hi}", include_yanked=True)
    return [by_version[lo], *(by_version[v] for v in inside), by_version[hi]]


def sweep_command(repro: str, package: str, lo: str, hi: str, variant: str) -> str:
    """The command that maps every release of a range (what to run when a bisect is unsure)."""
    spec = shlex.quote(f">={lo},<={hi}")
    return f"reprobox sweep {repro} --package {package} --range {spec} --variant {variant}"


def release_bisect(
    target: Target,
    package: str,
    good: str,
    bad: str,
    index: PackageIndex,
    *,
    strategy: Strategy = BINARY,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
    probes: Probes[str] | None = None,
) -> BisectSummary:
    """Bisect the releases of `package` between `good` (clean) and `bad` (reproduces).

    `strategy` says how: binary, a multisection for its `workers` (`search.multisect`: K
    probes at a time, on the target's back end), or flake-aware; its `verify` extra probes
    per side default to 2 over more than 8 releases, else none. `probes` replaces the real
    runs (tests)."""
    target, axis = release_axis(target, package, good, bad, index, probes)
    return drive(target, axis, strategy, log_path=log_path, on_probe=on_probe)


@dataclass(frozen=True)
class ReleaseAxis:
    """The releases of one package from one end to the other (yanked ones marked), each a
    probe of the variant's lock with that release pinned."""

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
        return outcome  # a release is its own answer

    def answer(self, summary: BisectSummary, outcome: Outcome[str]) -> str:
        return plain_answer(self.question, summary)


def release_axis(
    target: Target,
    package: str,
    good: str,
    bad: str,
    index: PackageIndex,
    probes: Probes[str] | None = None,
) -> tuple[Target, ReleaseAxis]:
    """The release axis of `package` from `good` to `bad`, and the target every probe runs
    (its overrides pinned to one commit each)."""
    repro, platform = target.repro, target.options.platform
    name = repro.check_pinned(package, "--package")
    target = pin_overrides(target, [name])  # every probe: the same commit of each source
    chosen = _range_releases(index.releases(package), package, good, bad)
    versions = [str(r.version) for r in chosen]
    yanked = [str(r.version) for r in chosen if r.yanked]
    header: dict[str, Any] = {
        "kind": "release", "repro": repro.name, "variant": target.variant,
        "package": name, "good": good, "bad": bad, "platform": platform,
        "versions": versions, **target.header(),
    }  # fmt: skip
    sweep = sweep_command(repro.name, name, versions[0], versions[-1], target.variant)
    question = Question(
        noun="release", candidates=versions, header=header,
        asked=BisectSummary.model_validate({**header, "yanked": yanked}), names=tuple(versions),
        # as the index spells them ("1.25" is 1.25.0), so each end is probed once
        good=str(Version(good)), bad=str(Version(bad)),
        key=Version, subject=f"{name} ", sweep=sweep,
        suggest=f"; map every release with `{sweep}`", note=target.note(),
    )  # fmt: skip
    return target, ReleaseAxis(question, target, package, probes)
