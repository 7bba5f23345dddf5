"""Is the answer true beyond the probes that found it? A bisect assumes one change between its
ends; these checks look for evidence against that before the answer is printed.

`verify_sides` probes K more items spread over each side of the boundary (the summary's
`contradicted_by` holds verdicts already on disk against a release answer).
One contradiction turns "found" into "non-monotone": the history changes more than once, and
only a sweep over every release can say where.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from reprobox.bisect.prober import BisectError, Prober
from reprobox.bisect.search import BisectResult
from reprobox.bisect.summary import Contradiction
from reprobox.core.protocol import Verdict

T = TypeVar("T")

VERIFY_ABOVE = 8  # ranges longer than this are verified by default
DEFAULT_VERIFY = 2


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
                    source="verify probe",
                )
            )
    return found, probed


def unique(found: Iterable[Contradiction]) -> list[Contradiction]:
    """One contradiction per item and verdict (the first source that saw it)."""
    seen: set[tuple[str, Verdict]] = set()
    kept: list[Contradiction] = []
    for item in found:
        if (item.item, item.verdict) not in seen:
            seen.add((item.item, item.verdict))
            kept.append(item)
    return kept


def check_ends(
    prober: Prober[str],
    good: str,
    bad: str,
    *,
    shown: Callable[[str], str] = str,
    noun: str = "release",
    sweep: str = "",
    workers: int = 1,
) -> None:
    """Fail fast, before any search, when the ends are not what the user says they are.
    Ends with the same verdict are no answer either way: the change may have come and gone
    inside the range, which a bisect cannot see (`sweep`, when given, is the command that
    probes every item). With `workers` > 1 both ends run at once."""
    if workers > 1:
        prober.probe_all([(good, 1), (bad, 1)], workers)  # the loop below reads them back
    got: dict[str, Verdict] = {}
    for flag, item in (("--good", good), ("--bad", bad)):
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
    if got["--good"] is Verdict.CLEAN and got["--bad"] is Verdict.REPRODUCED:
        return
    if got["--good"] is Verdict.REPRODUCED and got["--bad"] is Verdict.CLEAN:
        raise BisectError(
            f"--good {shown(good)} is reproduced, not clean, and --bad {shown(bad)} is clean: "
            "are --good and --bad the right way round?"
        )
    wrong, item, want = (
        ("--good", good, Verdict.CLEAN)
        if got["--good"] is not Verdict.CLEAN
        else ("--bad", bad, Verdict.REPRODUCED)
    )
    hint = f"; `{sweep}` probes every {noun}" if sweep else ""
    raise BisectError(
        f"{wrong} {shown(item)} is {got[wrong].value}, not {want.value}: both ends are "
        f"{got['--good'].value}, so either no {noun} between them changes the verdict, or the "
        f"change came and went inside the range (a bisect cannot tell){hint}"
    )
