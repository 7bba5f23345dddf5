"""Is the answer true beyond the probes that found it? A bisect assumes one change between its
ends; these checks look for evidence against that before the answer is printed.

`verify_sides` probes K more items spread over each side of the boundary; `verdicts_on_disk`
is the one reader of verdicts already on disk (this log, the record store's matrix records,
earlier bisects and sweeps of the same repro, variant, platform and overrides), wherever
`--log` points; the summary's `contradicted_by` holds them against the answer.
One contradiction turns "found" into "non-monotone": the history changes more than once, and
only a sweep over every release can say where. Ends that disagree with `--good`/`--bad` are
launched again (`REPEAT_ENDS` launches each) before the range or the order is blamed: ends
that disagree with themselves are noise (`NoisyEnds`, exit 1), never bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from reprobox.bisect.outcome import Known
from reprobox.bisect.probe_log import ProbeLog
from reprobox.bisect.prober import BisectError, Prober, Target
from reprobox.bisect.search import BisectResult
from reprobox.bisect.summary import (
    BisectSummary,
    CommitDetails,
    Contradiction,
    DateDetails,
    ReleaseDetails,
    SweepDetails,
    read_summaries,
    summary_file,
)
from reprobox.core.errors import ExitCode, ReproboxError
from reprobox.core.protocol import Verdict
from reprobox.core.records import RecordStore

T = TypeVar("T")

VERIFY_ABOVE = 8  # ranges longer than this are verified by default
DEFAULT_VERIFY = 2
# launches of each end (the first included) before ends that disagree with what the user
# said are blamed on the range or on the order of --good and --bad
REPEAT_ENDS = 3
NOISE_ADVICE = (
    "rerun this bisect with --flaky (a posterior over every candidate, each launch weighed), "
    'or declare [verdict] repeats for the variant (repros/README.md, "Noisy outcomes")'
)


class NoisyEnds(ReproboxError):
    """An end gave different verdicts when launched again: the outcome is noisy, and no
    boundary is claimed (exit 1, as a flaky answer), never bad input (exit 2)."""

    exit_code = ExitCode.FAILED


def default_verify(n_items: int) -> int:
    """How many extra probes per side a range gets when the user does not say."""
    return DEFAULT_VERIFY if n_items > VERIFY_ABOVE else 0


def spread(indices: Sequence[int], k: int) -> list[int]:
    """`k` of `indices`, evenly spread (all of them when there are no more than `k`)."""
    if len(indices) <= k:
        return list(indices)
    return [indices[round((j + 0.5) * len(indices) / k - 0.5)] for j in range(k)]


def expected_at(index: int, lo: int, hi: int, result: BisectResult[T]) -> Verdict | None:
    """What the answer says item `index` gives (None between the sides: not claimed)."""
    if index <= lo:
        return result.start_verdict
    if index >= hi:
        return result.end_verdict
    return None


def verify_sides(
    prober: Prober[T], items: Sequence[T], result: BisectResult[T], k: int, workers: int = 1
) -> tuple[list[Contradiction], list[str]]:
    """Probe `k` untried items spread over each side (`workers` at a time); the
    contradictions and what was probed."""
    lo, hi = items.index(result.last_start), items.index(result.first_end)
    untried = [i for i in range(len(items)) if not prober.seen(items[i])]
    picks = spread([i for i in untried if i < lo], k) + spread([i for i in untried if i > hi], k)
    if workers > 1:
        prober.probe_all([(items[i], 1) for i in picks], workers)  # the loop reads them back
    found: list[Contradiction] = []
    probed: list[str] = []
    for number, index in enumerate(picks):
        prober.prefetch([items[i] for i in picks[number + 1 : number + 2]])
        verdict = prober(items[index], 1)
        probed.append(prober.describe(items[index]))
        wanted = expected_at(index, lo, hi, result)
        if verdict is not None and wanted is not None and verdict is not wanted:
            found.append(
                Contradiction(
                    item=prober.describe(items[index]),
                    verdict=verdict,
                    expected=wanted,
                    source=_repeated_source(prober, items[index], verdict, workers),
                )
            )
    return found, probed


def _repeated_source(prober: Prober[T], item: T, first: Verdict, workers: int) -> str:
    """Where a contradicting verify probe's verdict came from: the item is launched again
    (`REPEAT_ENDS` in all) before the history is called non-monotone; one that disagrees with
    itself is named noisy, with its count."""
    jobs = [(item, attempt) for attempt in range(2, REPEAT_ENDS + 1)]
    seen = [first, *(v for v in prober.probe_all(jobs, workers) if v is not None)]
    if len(set(seen)) == 1:
        return "verify probe"
    hits = sum(v is Verdict.REPRODUCED for v in seen)
    return f"verify probe: {hits} of {len(seen)} launches reproduced, so the outcome is noisy"


def unique(found: Iterable[Contradiction]) -> list[Contradiction]:
    """One contradiction per item and verdict (the first source that saw it)."""
    seen: set[tuple[str, Verdict]] = set()
    kept: list[Contradiction] = []
    for item in found:
        if (item.item, item.verdict) not in seen:
            seen.add((item.item, item.verdict))
            kept.append(item)
    return kept


# a flake-aware or metric search logs each launch as a probe: on a noisy outcome one
# launch's per-launch verdict is a draw, so it neither agrees nor disagrees with a verdict
NOISY_STRATEGIES = frozenset({"flaky", "shift"})


def verdicts_on_disk(
    target: Target,
    summary: BisectSummary,
    log: ProbeLog,
    ours: set[str],
) -> tuple[list[Known], str]:
    """Every verdict on disk about an item of this bisect or sweep (`summary` says which
    kind, package or floated packages): this log beyond this session's probes `ours`, the
    newest matrix records (releases and sweeps), and earlier bisects and sweeps in the
    record store, each of the same repro, variant, platform and other overrides (with their
    commits). Read from the store whatever folder the log is in; the log's own summary is
    not an earlier one. The second value says what could not be read ("" when all could)."""
    repro, variant, platform = target.repro, target.variant, target.options.platform
    known: list[Known] = [
        (e.item, v, "this log")
        for e in log.entries.values()
        if (v := e.outcome) is not None and e.key not in ours
    ]
    problems: list[str] = []
    store = RecordStore(target.results)
    if summary.kind in ("release", "sweep") and summary.package:
        try:
            known += _records(target, summary.package, store)
        except (ReproboxError, OSError) as exc:
            problems.append(f"records on disk not checked ({exc})")
    earlier_list, unreadable = read_summaries(store.bisect_dir(repro.name))
    if unreadable:
        problems.append(f"{len(unreadable)} earlier summary file(s) unreadable")
    own = summary_file(log.path).resolve()
    for earlier in earlier_list:
        if Path(earlier.summary_path).resolve() == own or not _same_question(summary, earlier):
            continue
        if (earlier.repro, earlier.variant, earlier.platform) != (repro.name, variant, platform):
            continue
        if not target.same_overrides(earlier.overrides, earlier.override_commits):
            continue
        if earlier.strategy in NOISY_STRATEGIES:
            continue  # each probe one launch of a noisy outcome: a sample, not a verdict
        for probe in earlier.probes:
            if (verdict := probe.outcome) is not None:
                known.append((probe.item, verdict, f"bisect {earlier.id}"))
    return known, "; ".join(problems)


def _same_question(mine: BisectSummary, earlier: BisectSummary) -> bool:
    """Whether an earlier summary's items are this one's: releases of the same package
    (bisect or sweep), commits of the same package and repository, days floating the same
    packages."""
    mine_d, theirs = mine.details, earlier.details
    if isinstance(mine_d, ReleaseDetails | SweepDetails):
        return (
            isinstance(theirs, ReleaseDetails | SweepDetails) and theirs.package == mine_d.package
        )
    if isinstance(mine_d, CommitDetails):
        return isinstance(theirs, CommitDetails) and (theirs.package, theirs.repo) == (
            mine_d.package,
            mine_d.repo,
        )
    if isinstance(mine_d, DateDetails):
        return isinstance(theirs, DateDetails) and sorted(theirs.floated) == sorted(mine_d.floated)
    return False  # an attribution's environments are its own: never another's question


def _records(target: Target, package: str, store: RecordStore) -> list[Known]:
    """The newest matrix record of each cell that ran one release of `package` (or the
    repro's exact pin of it) with exactly the target's other overrides."""
    repro, variant, platform = target.repro, target.variant, target.options.platform
    default_pin = _exact_pin(repro.requirements(variant, platform), package)
    known: list[Known] = []
    for record in store.latest(repro.name):
        if record.variant != variant or record.platform != platform or record.params:
            continue
        if record.verdict not in (Verdict.CLEAN.value, Verdict.REPRODUCED.value):
            continue
        packages = {str(canonicalize_name(k)): v for k, v in record.packages.items()}
        version = packages.pop(package, None if packages or target.overrides else default_pin)
        if version is not None and target.same_overrides(packages, record.commits):
            known.append((version, Verdict(record.verdict), f"record {record.dir}"))
    return known


def _exact_pin(requirements: Iterable[str], package: str) -> str | None:
    """The version `package` is pinned to with ==, if it is."""
    for text in requirements:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) != package:
            continue
        pins = [s.version for s in requirement.specifier if s.operator == "=="]
        return pins[0] if len(pins) == 1 and len(requirement.specifier) == 1 else None
    return None


def seen_inside(
    known: Iterable[Known], items: Sequence[str], verdict: Verdict, key: Callable[[str], object]
) -> list[Known]:
    """The verdicts on disk strictly inside `items`' ends that are `verdict`, in order."""
    positions = {key(item): i for i, item in enumerate(items)}
    found = [
        (positions[key(item)], (item, v, source))
        for item, v, source in known
        if v is verdict and 0 < positions.get(key(item), 0) < len(items) - 1
    ]
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]


def check_ends(
    prober: Prober[T],
    good: T,
    bad: T,
    *,
    shown: Callable[[T], str] = str,
    noun: str = "release",
    sweep: str = "",
    workers: int = 1,
    items: Sequence[str] = (),
    on_disk: Sequence[Known] = (),
    key: Callable[[str], object] = str,
    flags: tuple[str, str] = ("--good", "--bad"),
    either_way: bool = False,
    advice: str = "",
) -> None:
    """Fail fast, before any search, when the ends are not what the user says they are.
    Ends with the same verdict are no answer either way: the change may have come and gone
    inside the range, which a bisect cannot see; verdicts `on_disk` inside the range
    (`items`, names compared by `key`) that differ are named (`sweep`, when given, is the
    command that probes every item). With `workers` > 1 both ends run at once. `flags` name
    the ends in errors; `either_way`: a range without a good or bad end (days), where a
    fix (reproducing, then clean) is a question too. `advice` follows ends alike when there
    is no `sweep` to suggest. Ends that disagree with what the user said are launched again
    first (`repeat_ends`); an end that then disagrees with itself is `NoisyEnds`."""
    if workers > 1:
        prober.probe_all([(good, 1), (bad, 1)], workers)  # the loop below reads them back
    good_flag, bad_flag = flags
    got: dict[str, Verdict] = {}
    for flag, item in ((good_flag, good), (bad_flag, bad)):
        verdict = prober(item, 1)
        if verdict is None:
            why = prober.entry(item).reason
            step = f"move {flag} to the nearest {noun} that can be tested here"
            step = f"`{sweep}` probes every {noun} and marks those it cannot test, or {step}"
            raise BisectError(
                f"{flag} {shown(item)} cannot be tested here: {why} (see {prober.log.path}); "
                + (step if sweep else step.rpartition(", or ")[2])
            )
        got[flag] = verdict
    if got[good_flag] is not got[bad_flag] and (either_way or got[good_flag] is Verdict.CLEAN):
        return
    seen = repeat_ends(prober, good, bad, workers)
    if any(len(set(verdicts)) > 1 for verdicts in seen):
        raise NoisyEnds(noisy_ends(zip(flags, (shown(good), shown(bad)), seen, strict=True)))
    times = _launches(seen)
    if got[good_flag] is Verdict.REPRODUCED and got[bad_flag] is Verdict.CLEAN:
        raise BisectError(
            f"{good_flag} {shown(good)} is reproduced, not clean, and {bad_flag} {shown(bad)} "
            f"is clean, {times}: are {good_flag} and {bad_flag} the right way round?"
        )
    wrong, item, want = (
        (good_flag, good, Verdict.CLEAN)
        if got[good_flag] is not Verdict.CLEAN
        else (bad_flag, bad, Verdict.REPRODUCED)
    )
    if either_way:  # both ends alike: name the end, not a side it was meant to be
        wrong, item, want = (
            bad_flag,
            bad,
            Verdict.CLEAN if got[bad_flag] is Verdict.REPRODUCED else Verdict.REPRODUCED,
        )
    hint = f"; `{sweep}` probes every {noun}" if sweep else advice
    other = Verdict.REPRODUCED if got[good_flag] is Verdict.CLEAN else Verdict.CLEAN
    inside = seen_inside(on_disk, items, other, key)
    if inside:
        shown_items = ", ".join(dict.fromkeys(name for name, _, _ in inside))  # as on disk
        sources = ", ".join(dict.fromkeys(source for _, _, source in inside))
        said = "reproducing" if other is Verdict.REPRODUCED else "clean"
        raise BisectError(
            f"{wrong} {shown(item)} is {got[wrong].value}, not {want.value}: both ends are "
            f"{got[good_flag].value} {times}; verdicts on disk show it {said} at {shown_items} "
            f"({sources}): the change came and went inside the range (a bisect cannot "
            f"answer that){hint}"
        )
    raise BisectError(
        f"{wrong} {shown(item)} is {got[wrong].value}, not {want.value}: both ends are "
        f"{got[good_flag].value} {times}, so either no {noun} between them changes the "
        f"verdict, or the change came and went inside the range (a bisect cannot tell){hint}"
    )


def repeat_ends(prober: Prober[T], good: T, bad: T, workers: int = 1) -> list[list[Verdict]]:
    """Each end's verdicts over `REPEAT_ENDS` launches (the new ones as new attempts, `workers`
    at a time; a launch that cannot test says nothing): one launch of a noisy outcome says
    little, so the ends are measured again before the question is called wrong."""
    jobs = [(item, attempt) for item in (good, bad) for attempt in range(2, REPEAT_ENDS + 1)]
    prober.probe_all(jobs, workers)  # read back below, with the first launches
    return [
        [v for attempt in range(1, REPEAT_ENDS + 1) if (v := prober(item, attempt)) is not None]
        for item in (good, bad)
    ]


def _launches(seen: Sequence[Sequence[Verdict]]) -> str:
    """`in 3 launches each` (or `in 3 and 2 launches`, when a repeat could not test)."""
    counts = sorted({len(verdicts) for verdicts in seen})
    if len(counts) == 1:
        return f"in {counts[0]} launch{'es' if counts[0] != 1 else ''} each"
    return f"in {len(seen[0])} and {len(seen[1])} launches"


def noisy_ends(ends: Iterable[tuple[str, str, list[Verdict]]]) -> str:
    """The refusal for ends that disagree with themselves: each end's count, what it means,
    and the two ways that handle a noisy outcome."""
    counts = [
        f"{flag} {name}: {sum(v is Verdict.REPRODUCED for v in verdicts)} of {len(verdicts)} "
        "launches reproduced"
        for flag, name, verdicts in ends
    ]
    counts[1:] = [text.removesuffix(" launches reproduced") for text in counts[1:]]
    return (
        f"flaky: the ends gave different verdicts when repeated ({'; '.join(counts)}): the "
        "outcome is noisy, so one launch of each end cannot tell whether the range or the "
        f"order of the ends is wrong; no boundary claimed: {NOISE_ADVICE}"
    )
