"""Where a noisy metric's mean shifts: a change-point posterior over the candidates.

A flake-aware search that judged each launch against the per-launch rule assumed a small false
rate before the change; a metric whose values overlap (40% of launches "reproduce" before the
change, 60% after) is outside that model, and it printed "no change" as certain. This search
works on the metric's samples instead, as the declared test does.

The model: the ordered candidates form two segments, before and after the first changed item
(the culprit), each with its own mean; or one segment ("no change"). Means and spreads are
unknown and integrated out (a flat prior on a level, Jeffreys' on a spread), so nothing about
the metric is assumed but its shape. Whether the mean changed is weighed with one spread
shared by the segments (`_log_change`: one spread, as "no change" has, so the two compare on
one footing); where it changed, with each segment's own spread (`_log_split`, Welch's t for
the shift: a release that widens the spread with the mean made the shared spread
overconfident at the boundary). A change is a shift of at least `min_effect` standard
deviations, either way: a smaller shift is no change that matters, which is what lets "no
change" be claimed at all, and only after the data rule out a shift of that size, in the
steadier side's sd, at every candidate (`_log_point`). The culprits' own prior on the shift
is log-uniform from half that (RANK_FLOOR) up to 10^10 sd: cut at exactly `min_effect`, a
true shift of that size made the partitions that put unluckily low releases before the
change (a larger apparent shift) win, 1 and 3 of 300 simulated searches (shared and own
spreads). With the spread plugged in per
hypothesis, the shift's integral is a Student-t mass.

The values enter that model as normal scores of their ranks among all values so far
(`_scores`), not as they are: a metric with heavier tails than normal otherwise made it
certain of a wrong release (see docs/noise.md). The levels the answer reports are the values'
own.

Probes come in batches (`batch` launches of one item, chosen from the estimated shift so one
batch's mean tells about a third of a bit): the next item is the one the posterior is least
sure of being before or after the change (probabilistic bisection), unless one side holds too
few samples to measure its level against, then that side's end. It stops when one answer
(a culprit, or no change) reaches `confidence`, or after `max_runs` launches, undecided.

Pure: the probe is injected; deterministic given the seed (ties only); resumes from the
observations a previous search returned.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Generic, TypeVar

from reprobox.bisect.flaky import check_search
from reprobox.core import stats

T = TypeVar("T")
# [(item, attempt), ...] -> each launch's metric value in order; None: cannot test (a skip)
MetricProbe = Callable[[list[tuple[T, int]]], list[float | None]]
Sample = tuple[T, float | None]  # (item, value); None: the item could not be tested

MAX_EFFECT = 1e10  # sd: the largest shift the prior allows (a deterministic one is ~1e9)
BATCH_BITS_SD = 1.0  # a batch's mean should sit about this many sd of its own from the other side
MAX_BATCH = 32
FIRST_BATCH = 5  # launches at each end before anything else: a level and a spread to start
RANK_FLOOR = 0.5  # where the culprits' shift prior starts, as a share of the smallest shift
MIN_SPLIT = 3  # samples each segment needs before its own spread is read (else: shared)
MIN_SIDE = 8  # samples each side of a claimed boundary needs (a claim is never made on a few)
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Level:
    """One item's (or one side's) samples: how many, their mean and their sum of squares
    about it."""

    n: int
    mean: float
    ss: float

    @property
    def sd(self) -> float | None:
        return math.sqrt(self.ss / (self.n - 1)) if self.n > 1 else None


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


def _scores(values: list[list[float]]) -> _Sums:
    """Every item's values replaced by their normal scores among all values so far (Blom's
    (r - 3/8) / (n + 1/4), tied values sharing their mean rank), as per-item sums. The
    posterior reads these, not the values: its Gaussian likelihood, fed a metric with
    heavier tails than normal (t with 3 degrees of freedom, as transformers' eval-loss gap
    in the corpus has), was certain of a wrong release in 6 to 21% of simulated searches,
    an outlier in a release of few launches moving its mean; a score is bounded by its rank.
    On normal data the scores are the values standardized, to within sampling error."""
    flat = sorted((value, index) for index, row in enumerate(values) for value in row)
    total = len(flat)
    sums = _Sums(len(values))
    start = 0
    while start < total:
        end = start
        while end + 1 < total and flat[end + 1][0] == flat[start][0]:
            end += 1
        rank = (start + end) / 2 + 1
        score = _NORMAL.inv_cdf((rank - 0.375) / (total + 0.25))
        for _, index in flat[start : end + 1]:
            sums.add(index, score)
        start = end + 1
    return sums


class _Sums:
    """Per-item sums of (value - reference) and its square, so any segment's mean and sum of
    squares come from two prefix differences (the reference keeps large metrics exact)."""

    def __init__(self, size: int) -> None:
        self.n = [0] * size
        self.s = [0.0] * size
        self.q = [0.0] * size
        self.ref: float | None = None

    def add(self, index: int, value: float) -> None:
        if self.ref is None:
            self.ref = value
        x = value - self.ref
        self.n[index] += 1
        self.s[index] += x
        self.q[index] += x * x

    def level(self, lo: int, hi: int) -> Level:
        n = sum(self.n[lo:hi])
        if n == 0:
            return Level(0, 0.0, 0.0)
        s, q = math.fsum(self.s[lo:hi]), math.fsum(self.q[lo:hi])
        mean = s / n
        return Level(n, mean + (self.ref or 0.0), max(q - s * mean, 0.0))


def _floor(n: int, *levels: Level) -> float:
    """The least sum of squares n values may show: values exactly alike (a deterministic
    metric) would otherwise give a spread of zero and an infinite likelihood. Relative to
    the largest level, so a deterministic shift measures at most 2e9 sd: inside the prior
    (MAX_EFFECT), where a floor relative to one side's level put it outside and made every
    partition that kept the metric exact look impossible."""
    scale = max([1.0, *(abs(level.mean) for level in levels)])
    return n * (1e-9 * scale) ** 2


def _log_t_mass(nu: float, lo: float, hi: float) -> float:
    """log of P(lo < T_nu < hi), with the upper tail read from the side that keeps digits."""
    if lo > 0:
        mass = t_sf(lo, nu) - t_sf(hi, nu)
    else:
        mass = stats.t_cdf(hi, nu) - stats.t_cdf(lo, nu)
    return math.log(max(mass, 1e-300))


def t_sf(t: float, nu: float) -> float:
    """P(T_nu > t) without the cancellation of 1 - cdf."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    return stats.t_cdf(-t, nu)


def _log_change(before: Level, after: Level, min_effect: float) -> float:
    """log marginal likelihood (up to what every hypothesis shares) of two segments whose
    means differ by at least `min_effect` sd, either way: the shift d integrated against a
    log-uniform prior on |d| / sd, sd the pooled within-segment spread plugged in; with the
    level flat and the spread Jeffreys', the likelihood in d is a Student-t kernel
    (S + c (delta - d)^2)^(-(n-1)/2), whose mass is read from the t distribution and the
    prior taken where the kernel sits."""
    n = before.n + after.n
    if before.n == 0 or after.n == 0:
        return 0.0  # no data on one side: the shift is unconstrained, as "no change" is
    nu = n - 2
    ss = max(before.ss + after.ss, _floor(n, before, after))
    if nu < 1:
        return 0.0
    c = before.n * after.n / n
    delta = after.mean - before.mean
    sd = math.sqrt(ss / nu)
    scale = math.sqrt(ss / (c * nu))  # the kernel's width in d
    lo_d, hi_d = min_effect * sd, MAX_EFFECT * sd
    log_norm = (
        0.5 * math.log(nu * math.pi)
        + math.lgamma(nu / 2)
        - math.lgamma((nu + 1) / 2)
        + math.log(scale)
        - (n - 1) / 2 * math.log(ss)
    )
    parts = []
    for sign in (1.0, -1.0):  # a rise, a fall: half the prior each
        centre = sign * delta
        at = min(max(centre, lo_d), hi_d)
        log_prior = -math.log(2 * at * math.log(MAX_EFFECT / min_effect))
        lo, hi = (lo_d - centre) / scale, (hi_d - centre) / scale
        parts.append(log_prior + _log_t_mass(nu, lo, hi))
    top = max(parts)
    return log_norm + top + math.log(sum(math.exp(p - top) for p in parts))


def _log_point(before: Level, after: Level, min_effect: float) -> float:
    """log marginal likelihood of two segments whose means differ by exactly `min_effect` sd,
    either way: the least favourable change, against which "no change" is weighed (a
    shift at least that large only makes "no change" less likely, so its posterior from
    this is the cautious one). The sd is the steadier segment's own where both have a few
    samples: a release that widens the spread with a quarter-sd shift of the mean (in the
    sd before it) measured under a quarter of the pooled sd, and "no change" was claimed
    in 5 of 300 simulated searches at a budget of 6000 launches."""
    n = before.n + after.n
    if before.n == 0 or after.n == 0 or n < 3:
        return 0.0
    nu = n - 2
    ss = max(before.ss + after.ss, _floor(n, before, after))
    c = before.n * after.n / n
    delta = after.mean - before.mean
    unit = math.sqrt(ss / nu)
    if min(before.n, after.n) >= MIN_SPLIT:
        unit = min(
            unit, *(math.sqrt(max(seg.ss, _floor(seg.n, before, after)) / (seg.n - 1))
                    for seg in (before, after))
        )  # fmt: skip
    d = min_effect * unit
    parts = [-(n - 1) / 2 * math.log(ss + c * (delta - sign * d) ** 2) for sign in (1.0, -1.0)]
    top = max(parts)
    return top + math.log(sum(math.exp(p - top) for p in parts) / 2)


def _log_split(before: Level, after: Level, min_effect: float) -> float:
    """log marginal likelihood of two segments with their own means and their own spreads
    (flat levels, Jeffreys' spreads, integrated out), the shift weighed by the same
    log-uniform prior as `_log_change`, its posterior read as Welch's t. Only culprits are
    compared on this footing: every one has two spreads, so the improper priors cancel."""
    parts_ml = 0.0
    sds = []
    for seg in (before, after):
        ss = max(seg.ss, _floor(seg.n, before, after))
        parts_ml += math.lgamma((seg.n - 1) / 2) - 0.5 * math.log(seg.n)
        parts_ml -= (seg.n - 1) / 2 * math.log(ss)
        sds.append(ss / (seg.n - 1) / seg.n)  # the squared standard error of its mean
    se = math.sqrt(sds[0] + sds[1])
    nu = (sds[0] + sds[1]) ** 2 / (sds[0] ** 2 / (before.n - 1) + sds[1] ** 2 / (after.n - 1))
    pooled = math.sqrt(
        max(before.ss + after.ss, _floor(before.n + after.n, before, after))
        / (before.n + after.n - 2)
    )
    delta = after.mean - before.mean
    lo_d, hi_d = min_effect * pooled, MAX_EFFECT * pooled
    parts = []
    for sign in (1.0, -1.0):
        centre = sign * delta
        at = min(max(centre, lo_d), hi_d)
        log_prior = -math.log(2 * at * math.log(MAX_EFFECT / min_effect))
        parts.append(log_prior + _log_t_mass(nu, (lo_d - centre) / se, (hi_d - centre) / se))
    top = max(parts)
    return parts_ml + top + math.log(sum(math.exp(p - top) for p in parts))


def _log_none(whole: Level) -> float:
    """log marginal likelihood of one segment, on the same footing as `_log_change`."""
    if whole.n < 2:
        return 0.0
    ss = max(whole.ss, _floor(whole.n, whole))
    return -(whole.n - 1) / 2 * math.log(ss)


def _posterior(sums: _Sums, log_prior: list[float], min_effect: float) -> list[float]:
    """The weight of each hypothesis: h (1..size-1) the culprit items[h], under the broad
    prior on the shift; index 0 "no change", weighed against the least favourable change
    (`_log_point`). The two need not sum to one: each is the cautious reading of its own
    claim."""
    size = len(sums.n)
    ref = sums.ref or 0.0
    pn, ps, pq = [0], [0.0], [0.0]  # prefix sums: segment [lo, hi) is a difference of two
    for i in range(size):
        pn.append(pn[-1] + sums.n[i])
        ps.append(ps[-1] + sums.s[i])
        pq.append(pq[-1] + sums.q[i])

    def level(lo: int, hi: int) -> Level:
        n = pn[hi] - pn[lo]
        if n == 0:
            return Level(0, 0.0, 0.0)
        s, q = ps[hi] - ps[lo], pq[hi] - pq[lo]
        return Level(n, s / n + ref, max(q - s * s / n, 0.0))

    whole = level(0, size)
    none = log_prior[0] + _log_none(whole)
    if whole.n < 3:  # too few samples to tell one segment from two
        return _normalize([none] + [log_prior[h] + none - log_prior[0] for h in range(1, size)])
    sides = [(level(0, h), level(h, size)) for h in range(1, size)]
    low = min_effect * RANK_FLOOR
    broad = [log_prior[h] + _log_change(*sides[h - 1], low) for h in range(1, size)]
    point = [log_prior[h] + _log_point(*sides[h - 1], min_effect) for h in range(1, size)]
    weights = _normalize([none, *broad])
    if all(min(a.n, b.n) >= MIN_SPLIT for a, b in sides):
        # where the change is: each segment with its own spread (a release that changes the
        # spread with the mean made the shared spread overconfident at the boundary)
        split = _normalize([log_prior[h] + _log_split(*sides[h - 1], low)
                            for h in range(1, size)])  # fmt: skip
        changed = 1.0 - weights[0]
        weights[1:] = [changed * w for w in split]
    weights[0] = _normalize([none, *point])[0]
    return weights


def _normalize(logs: list[float]) -> list[float]:
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


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
    than the item to be probed would have (its level would be the weaker half)."""
    after, acc = [0.0] * size, 0.0
    for i in range(1, size):
        acc += w[i]
        after[i] = acc
    leader = max(range(1, size), key=lambda h: w[h])
    picks: list[int] = []
    for j in range(1, count + 1):
        goal = j / (count + 1)
        options = [i for i in range(size) if allowed[i]]
        best = min(abs(after[i] - goal) for i in options)
        pick = rng.choice([i for i in options if abs(after[i] - goal) <= best + 1e-12])
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
