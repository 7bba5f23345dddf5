"""Find where a verdict flips in an ordered history, and the smallest change that flips it.

Pure logic, in the manner of JAX-Toolbox's triage tool: the probe is injected, so the search
is tested without environments or GPUs. A probe returns a verdict, or None to skip (cannot
test here, cannot install) — skips widen the answer instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reprobox.core.protocol import Verdict

T = TypeVar("T")
# (item, attempt) -> verdict, or None to skip; attempt > 1 only for confirmation re-runs
Probe = Callable[[T, int], Verdict | None]


class SearchError(ValueError):
    """The question cannot be answered as asked (untestable or equal endpoints).

    A plain error, so this module stays free of the harness; the callers turn it into the
    harness's BadInput with advice fitting their kind of bisect.
    """

    def __init__(self, message: str, *, same_ends: bool = False) -> None:
        super().__init__(message)
        self.same_ends = same_ends  # both ends gave one verdict (the change may come and go)


@dataclass
class BisectResult(Generic[T]):
    status: str  # found | ambiguous | flaky
    start_verdict: Verdict
    end_verdict: Verdict
    last_start: T  # the newest item known to give the start verdict
    first_end: T  # the oldest item known to give the end verdict
    candidates: list[T]  # where the flip can be (one item when found)
    probes: list[tuple[T, int, Verdict | None]] = field(default_factory=list)
    flaky: list[T] = field(default_factory=list)


def bisect(
    items: Sequence[T],
    probe: Probe[T],
    *,
    confirm: int = 1,
    prefetch: Callable[[list[T]], None] | None = None,
) -> BisectResult[T]:
    """Binary search for the first item whose verdict differs from items[0]'s.

    Both ends are probed first and must give different verdicts. A skipped item is replaced
    by its nearest untried neighbour of the middle, as `git bisect skip` does; when only
    skipped items separate the two sides, the answer is the set of candidates. Finally the
    two boundary items are probed `confirm` more times; any disagreement is reported as
    flaky rather than guessed. `prefetch` hears the items the next step may probe.
    """
    if len(items) < 2:
        raise SearchError("need at least two items to bisect")
    probes: list[tuple[T, int, Verdict | None]] = []

    def run(index: int, attempt: int = 1) -> Verdict | None:
        verdict = probe(items[index], attempt)
        probes.append((items[index], attempt, verdict))
        return verdict

    first, last = run(0), run(len(items) - 1)
    if first is None or last is None:
        untestable = items[0] if first is None else items[-1]
        raise SearchError(f"endpoint {untestable} cannot be tested here")
    start, end = first, last
    if start is end:
        raise SearchError(
            f"both ends ({items[0]} and {items[-1]}) are {start.value}: nothing to bisect",
            same_ends=True,
        )

    lo, hi, skipped = 0, len(items) - 1, set[int]()
    while (mid := _middle(lo, hi, skipped)) is not None:
        if prefetch is not None:
            prefetch([items[i] for i in _next_middles(lo, mid, hi, skipped)])
        verdict = run(mid)
        if verdict is None:
            skipped.add(mid)
        elif verdict is start:
            lo = mid
        elif verdict is end:
            hi = mid

    flaky: list[T] = []
    for index, expected in ((lo, start), (hi, end)):
        for attempt in range(2, confirm + 2):
            if run(index, attempt) is not expected:
                flaky.append(items[index])
                break
    between = [items[i] for i in range(lo + 1, hi)]
    status = "flaky" if flaky else ("ambiguous" if between else "found")
    return BisectResult(
        status=status,
        start_verdict=start,
        end_verdict=end,
        last_start=items[lo],
        first_end=items[hi],
        candidates=[*between, items[hi]],
        probes=probes,
        flaky=flaky,
    )


def _middle(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untried, unskipped index closest to the middle of (lo, hi), if any."""
    inside = [i for i in range(lo + 1, hi) if i not in skipped]
    if not inside:
        return None
    centre = (lo + hi) / 2
    return min(inside, key=lambda i: (abs(i - centre), i))


def _next_middles(lo: int, mid: int, hi: int, skipped: set[int]) -> list[int]:
    """What the search probes after `mid`, whichever verdict `mid` gives."""
    found = [_middle(lo, mid, skipped), _middle(mid, hi, skipped)]
    return [i for i in found if i is not None]


def ddmin(changes: Sequence[T], flips: Callable[[list[T]], bool | None]) -> list[T]:
    """Zeller's delta debugging: a 1-minimal subset of `changes` that still flips the verdict.

    `flips(subset)` applies the subset to the last state before the flip and says whether the
    verdict flips (None when that combination cannot be tested: treated as "does not").
    A change that only flips together with another one comes back as the pair.
    """
    current = list(changes)
    granularity = 2
    while len(current) >= 2:
        chunks = _split(current, granularity)
        for chunk in chunks:
            if flips(chunk) is True:
                current, granularity = chunk, 2
                break
        else:
            for chunk in chunks:
                complement = [c for c in current if c not in chunk]
                if len(chunks) > 2 and flips(complement) is True:
                    current, granularity = complement, max(granularity - 1, 2)
                    break
            else:
                if granularity >= len(current):
                    break
                granularity = min(len(current), granularity * 2)
    return current


def _split(items: list[T], parts: int) -> list[list[T]]:
    size, extra = divmod(len(items), parts)
    chunks: list[list[T]] = []
    start = 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        chunks.append(items[start:stop])
        start = stop
    return [c for c in chunks if c]
