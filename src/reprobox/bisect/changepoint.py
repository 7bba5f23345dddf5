"""Where a noisy metric's mean shifts: a change-point posterior over the candidates.

A flake-aware search that judged each launch against the per-launch rule assumed a small false
rate before the change; a metric whose values overlap (40% of launches "reproduce" before the
change, 60% after) is outside that model, and it printed "no change" as certain. This search
works on the metric's samples instead, as the declared test does.

The model: the ordered candidates form two segments, before and after the first changed item
(the culprit), each with its own mean and its own spread; or "no change": one mean, the
spread free to change at any one item (a release that changes the spread alone did not
change what a t-test on the mean reads). Means and spreads are unknown and integrated out (a
flat prior on a level, Jeffreys' on a spread), so nothing about the metric is assumed but
its shape; each hypothesis is read from the Welch estimate of the shift at its boundary
(`segments._Welch`). With one spread shared by the segments, a release that tripled the
spread and left the mean alone was named as the change, certain, in 2 of 1,000 simulated
searches; and a release that widened the spread with a quarter-sd shift was found in 5% of
simulated searches at N = 32 within 2,000 launches, 41% once the spread's own change
told where the change is (51% with the tie rule of `_choose`; 100% within 8,000). A
change is a shift of at least `min_effect` standard deviations, either way: a smaller
shift is no change that matters, which is what lets "no change" be claimed at all, and
only after the data rule out a shift of that size, in the steadier side's sd, at every
candidate. The culprits' own prior on the shift is log-uniform from half
that (RANK_FLOOR) up to 10^10 sd: cut at exactly `min_effect`, a true shift of that size
made the partitions that put unluckily low releases before the change (a larger apparent
shift) win, 1 and 3 of 300 simulated searches. Until each segment holds a few samples
(MIN_SPLIT), the segments share one spread.

The values enter that model as normal scores of their ranks among all values so far
(`_scores`), not as they are: a metric with heavier tails than normal otherwise made it
certain of a wrong release (see docs/noise.md). The levels the answer reports are the values'
own.

Probes come in batches (`batch` launches of one item, chosen from the estimated shift so one
batch's mean tells about a third of a bit): the next item is the one the posterior is least
sure of being before or after the change (probabilistic bisection), unless one side holds too
few samples to measure its level against, then that side's end. It stops when one answer
(a culprit, or no change) reaches `confidence`, or after `max_runs` launches, undecided.

The likelihoods live in `segments`. Pure: the probe is injected; deterministic given the
seed (ties only); resumes from the observations a previous search returned.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reprobox.bisect.flaky import check_search
from reprobox.bisect.segments import (
    MAX_EFFECT,
    Level,
    _floor,
    _posterior,
    _scores,
    _Sums,
)

T = TypeVar("T")
# [(item, attempt), ...] -> each launch's metric value in order; None: cannot test (a skip)
MetricProbe = Callable[[list[tuple[T, int]]], list[float | None]]
Sample = tuple[T, float | None]  # (item, value); None: the item could not be tested

BATCH_BITS_SD = 1.0  # a batch's mean should sit about this many sd of its own from the other side
MAX_BATCH = 32
FIRST_BATCH = 5  # launches at each end before anything else: a level and a spread to start
MIN_SIDE = 8  # samples each side of a claimed boundary needs (a claim is never made on a few)


@dataclass
class ShiftAnswer(Generic[T]):
    """What the search concluded about the metric, how sure it is, and what it cost."""

    status: str  # found | no_change | undecided
    culprit: T | None  # found: the first item of the shifted segment
    confidence: float  # the posterior of the answer (undecided: of the leader)
    no_change: float
    runs: int  # launches, skips included
    posterior: list[tuple[T, float]]  # each candidate culprit (items[1:]) and its probability
    levels: list[tuple[T, Level]]  # every probed item's samples
    before: Level | None  # found: the samples on each side of the culprit
    after: Level | None
    sd: float | None  # the pooled within-segment sd under the answer (the unit of `effect`)
    top: list[tuple[T | None, float]]  # undecided: the leading answers (None: no change)
    min_effect: float
    observations: list[Sample[T]] = field(default_factory=list)  # to resume from
    target: float = 0.99

    @property
    def effect(self) -> float | None:
        """The shift after - before in sd (found)."""
        if self.before is None or self.after is None or not self.sd:
            return None
        return (self.after.mean - self.before.mean) / self.sd


def batch_size(effect: float, min_effect: float) -> int:
    """Launches a probe takes: enough that one batch's mean lies about BATCH_BITS_SD of its
    own standard errors from the other side's level, at the shift seen (at least the
    smallest that matters)."""
    seen = max(abs(effect), min_effect)
    return max(2, min(MAX_BATCH, math.ceil((BATCH_BITS_SD / seen) ** 2)))


def _choose(
    sums: _Sums, w: list[float], allowed: list[bool], size: int, count: int, rng: random.Random
) -> list[int]:
    """The items least surely before or after the change (after_i = P(culprit <= i)), one per
    quantile for `count` workers; a side's end instead when that side holds fewer samples
    than the item to be probed would have (its level would be the weaker half).

    Items equally far from the quantile go by their distance to the leader's boundary: once
    a culprit leads at 0.99 and more, every item past it has after_i = 1 to the last digit,
    and a random one of them drew the launches (80 - 760 at each item past it, 46 - 128 at
    the item before it, in the 9 of 60 simulated searches left undecided at 6,000)."""
    after, acc = [0.0] * size, 0.0
    for i in range(1, size):
        acc += w[i]
        after[i] = acc
    leader = max(range(1, size), key=lambda h: w[h])
    options = [i for i in range(size) if allowed[i]]
    picks: list[int] = []
    for j in range(1, count + 1):
        goal = j / (count + 1)
        best = min(abs(after[i] - goal) for i in options)
        tied = [i for i in options if abs(after[i] - goal) <= best + 1e-12]
        near = min(abs(2 * i - 2 * leader + 1) for i in tied)  # from the gap before the leader
        pick = rng.choice([i for i in tied if abs(2 * i - 2 * leader + 1) == near])
        contested = sums.n[pick] + 1
        left = sum(sums.n[:leader]) - (sums.n[pick] if pick < leader else 0)
        right = sum(sums.n[leader:]) - (sums.n[pick] if pick >= leader else 0)
        if left < contested and allowed[0] and pick != 0:
            pick = 0
        elif right < contested and allowed[size - 1] and pick != size - 1:
            pick = size - 1
        picks.append(pick)
    return picks


def shift_search(
    items: Sequence[T],
    probe: MetricProbe[T],
    *,
    confidence: float = 0.999,
    max_runs: int = 1000,
    workers: int = 1,
    seed: int = 0,
    min_effect: float = 0.25,
    prior_no_change: float = 0.1,
    observations: Sequence[Sample[T]] = (),
) -> ShiftAnswer[T]:
    """Probe in batches until one answer (a culprit, or no change) has posterior >=
    `confidence`, or `max_runs` launches are spent; `workers` items a round. `observations`
    resumes a search (max_runs = 0 only reads their posterior). A launch giving None skips
    its item: counted as a run, never probed again."""
    size = len(items)
    check_search(size, workers, confidence, prior_no_change)
    if not 0 < min_effect < MAX_EFFECT:
        raise ValueError("min_effect must be a positive number of standard deviations")
    log_prior = [math.log(prior_no_change)]
    log_prior += [math.log((1 - prior_no_change) / (size - 1))] * (size - 1)
    where = {item: i for i, item in enumerate(items)}
    sums = _Sums(size)  # the values themselves: the levels the answer reports
    kept: list[list[float]] = [[] for _ in range(size)]  # ranked for the posterior
    allowed = [True] * size
    tries = [0] * size
    seen: list[Sample[T]] = []

    def take(index: int, value: float | None) -> None:
        tries[index] += 1
        seen.append((items[index], value))
        if value is None or not math.isfinite(value):
            allowed[index] = False
        else:
            sums.add(index, value)
            kept[index].append(value)

    for item, value in observations:
        if item not in where:
            raise ValueError(f"observation of {item!r}, which is not in the range")
        take(where[item], value)
    rng = random.Random(seed)
    while True:
        scores = _scores(kept)
        w = _posterior(scores, log_prior, min_effect)
        if _claim(sums, w, confidence) or len(seen) >= max_runs or not any(allowed):
            break
        left = max_runs - len(seen)
        jobs: list[int] = []
        for end in (0, size - 1):  # both ends first: a level and a spread on each side
            if allowed[end] and sums.n[end] < FIRST_BATCH:
                jobs += [end] * (FIRST_BATCH - sums.n[end])
        if not jobs:
            effect = _effect(scores, w, size)
            per = batch_size(effect, min_effect)
            for pick in _choose(sums, w, allowed, size, workers, rng):
                jobs += [pick] * per
        jobs = jobs[:left]
        attempts: list[tuple[T, int]] = []  # each launch its own attempt: its own run
        counted: dict[int, int] = {}
        for index in jobs:
            counted[index] = counted.get(index, tries[index]) + 1
            attempts.append((items[index], counted[index]))
        values = probe(attempts)
        for index, value in zip(jobs, values, strict=True):
            if allowed[index]:
                take(index, value)
            else:
                tries[index] += 1
                seen.append((items[index], None))
    return _answer(items, sums, w, seen, confidence, min_effect)


def _claim(sums: _Sums, w: list[float], target: float) -> str | None:
    """The answer the posterior gives at `target`, if its samples are enough to stand on:
    a culprit needs MIN_SIDE samples on each side of it, "no change" twice that in all
    (the plugged-in spread is a poor guess from a handful)."""
    size = len(sums.n)
    best = max(range(1, size), key=lambda h: (w[h], -h))
    if w[best] >= target and min(sum(sums.n[:best]), sum(sums.n[best:])) >= MIN_SIDE:
        return "found"
    if w[0] >= target and sum(sums.n) >= 2 * MIN_SIDE:
        return "no_change"
    return None


def _effect(sums: _Sums, w: list[float], size: int) -> float:
    """The shift in sd at the likeliest culprit: what sizes the next batch."""
    h = max(range(1, size), key=lambda i: w[i])
    before, after = sums.level(0, h), sums.level(h, size)
    n = before.n + after.n
    if before.n == 0 or after.n == 0 or n < 3:
        return 0.0
    sd = math.sqrt(max(before.ss + after.ss, _floor(n, before, after)) / (n - 2))
    return (after.mean - before.mean) / sd if sd > 0 else 0.0


def _answer(
    items: Sequence[T],
    sums: _Sums,
    w: list[float],
    seen: list[Sample[T]],
    target: float,
    min_effect: float,
) -> ShiftAnswer[T]:
    size = len(items)
    none = w[0]
    best = max(range(1, size), key=lambda h: (w[h], -h))
    ranked: list[tuple[T | None, float]] = sorted(
        [(items[h], w[h]) for h in range(1, size)] + [(None, none)], key=lambda t: -t[1]
    )
    before = after = None
    status = _claim(sums, w, target) or "undecided"
    if status == "no_change":
        culprit, conf = None, none
    elif status == "found":
        culprit, conf = items[best], w[best]
        before, after = sums.level(0, best), sums.level(best, size)
    else:
        culprit, conf = None, ranked[0][1]
    top: list[tuple[T | None, float]] = []
    if status == "undecided":
        held = 0.0
        for item, prob in ranked:
            top.append((item, prob))
            held += prob
            if held >= target or len(top) >= 5:
                break
    if before is not None and after is not None:
        n = before.n + after.n
        sd = math.sqrt((before.ss + after.ss) / (n - 2)) if n > 2 else None
    else:
        sd = sums.level(0, size).sd
    return ShiftAnswer(
        status=status,
        culprit=culprit,
        confidence=conf,
        no_change=none,
        runs=len(seen),
        posterior=[(items[h], w[h]) for h in range(1, size)],
        levels=[(items[i], sums.level(i, i + 1)) for i in range(size) if sums.n[i]],
        before=before,
        after=after,
        sd=sd,
        top=top,
        min_effect=min_effect,
        observations=seen,
        target=target,
    )
