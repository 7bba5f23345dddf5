"""Release bisection: which release of one package flips a variant's verdict.

Yanked releases are candidates too (they install by exact pin, and a boundary at one is worth
knowing), marked as such. The answer says what it assumed (one change between the ends) and is
checked, before it is printed, against extra probes spread over each side (`verify`) and
every verdict already on disk for the range: matrix records and earlier bisects or sweeps.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from reprobox.bisect import checks
from reprobox.bisect.log import ProbeLog
from reprobox.bisect.prober import (
    Prober,
    Probes,
    Target,
    answering,
    default_log,
    pin_overrides,
    release_probes,
)
from reprobox.bisect.search import ThreadRunner, bisect, multisect
from reprobox.bisect.summary import (
    BisectSummary,
    Contradiction,
    ProbeEntry,
    answer,
    assumption,
    from_search,
    runs_dir,
    write_summary,
)
from reprobox.core.errors import BadInput
from reprobox.envs.index import PackageIndex, Release, select


def release_range(index: PackageIndex, package: str, good: str, bad: str) -> list[str]:
    """The releases from the older to the newer endpoint, oldest first, endpoints included;
    yanked releases in, pre-releases out."""
    return [str(r.version) for r in _range_releases(index.releases(package), package, good, bad)]


def _range_releases(releases: list[Release], package: str, good: str, bad: str) -> list[Release]:
    if Version(good) == Version(bad):
        raise BadInput(f"--good and --bad are the same release ({good}): nothing to bisect")
    by_version = {r.version: r for r in releases}
    for end, value in (("--good", good), ("--bad", bad)):
        if Version(value) not in by_version:
            raise BadInput(f"{end} {package} {value} does not exist on the index")
    lo, hi = sorted([Version(good), Version(bad)])
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
    confirm: int = 1,
    verify: int | None = None,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
    probes: Probes[str] | None = None,
    workers: int = 1,
) -> BisectSummary:
    """Bisect the releases of `package` between `good` (clean) and `bad` (reproduces).

    `verify` extra probes per side (default: 2 over more than 8 releases, else none); `probes`
    replaces the real runs (tests). With `workers` > 1 the ends run at once and the search is
    a multisection (`search.multisect`): K probes at a time, on the target's back end."""
    repro, platform = target.repro, target.options.platform
    name = canonicalize_name(package)
    if name not in repro.pinned_packages():
        raise BadInput(f"{package} is not a package that {repro.name} pins")
    target = pin_overrides(target, [name])  # every probe: the same commit of each source
    chosen = _range_releases(index.releases(package), package, good, bad)
    versions = [str(r.version) for r in chosen]
    yanked = [str(r.version) for r in chosen if r.yanked]
    header: dict[str, Any] = {
        "kind": "release", "repro": repro.name, "variant": target.variant,
        "package": name, "good": good, "bad": bad, "platform": platform,
        "versions": versions, **target.header(),
    }  # fmt: skip
    path = log_path or default_log(target, header)
    sweep = sweep_command(repro.name, name, versions[0], versions[-1], target.variant)
    question = BisectSummary.model_validate(header)
    with ProbeLog(path, header) as log:
        if probes is None:
            probes = release_probes(target, package, runs_dir(path))
        marked = set(yanked)
        prober = Prober(
            probes,
            log,
            str,
            tags=lambda v: ["yanked"] if v in marked else [],
            on_probe=on_probe,
        )
        started = time.monotonic()
        found: list[Contradiction] = []
        verified: list[str] = []
        try:
            # as the index spells them ("1.25" is 1.25.0), so each end is probed once
            before, _ = checks.verdicts_on_disk(target, question, log, set())
            checks.check_ends(
                prober, str(Version(good)), str(Version(bad)), sweep=sweep, workers=workers,
                items=versions, on_disk=before, key=Version,
            )  # fmt: skip
            with answering():
                if workers > 1:
                    runner = ThreadRunner(prober, workers, on_interrupt=prober.stop)
                    result = multisect(
                        versions, prober, workers=workers, confirm=confirm, runner=runner
                    )
                else:
                    result = bisect(versions, prober, confirm=confirm, prefetch=prober.prefetch)
            found = [
                Contradiction(item=item, verdict=verdict, expected=expected, source="probe")
                for item, verdict, expected in result.contradictions
            ]
            if result.status != "flaky":
                k = checks.default_verify(len(versions)) if verify is None else verify
                contradicting, verified = checks.verify_sides(prober, versions, result, k, workers)
                found += contradicting
        finally:
            prober.close()
        ours = {p.key for p in prober.runs}
        on_disk, unread = checks.verdicts_on_disk(target, question, log, ours)
        summary = from_search(header, result, [], verified, agreeing=0, yanked=yanked)
        against, agreeing = summary.contradicted_by(on_disk)
        found = checks.unique([*found, *against])
        summary = from_search(header, result, found, verified, agreeing=agreeing, yanked=yanked)
        extra = (
            (f", {len(verified)} of them to verify" if verified else "")
            + (f"; {agreeing} verdict(s) on disk agree" if agreeing else "")
            + (f"; {unread}" if unread else "")
            + target.note()
        )
        probed = len({p.item for p in prober.runs})
        summary.assumption = assumption(
            "release", (versions[0], versions[-1]), probed, len(versions), extra
        )
        summary.result = answer(
            summary, "release", f"{name} ", (versions[0], versions[-1]),
            suggest=f"; map every release with `{sweep}`",
        )  # fmt: skip
        summary = summary.counts(prober.runs, len(versions), time.monotonic() - started)
        return write_summary(path, summary)
