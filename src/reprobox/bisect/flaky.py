"""A flake-aware boundary search: where a noisy verdict starts, with the confidence it has.

After Google's Flake Aware Culprit Finding and git bayesect. Plain bisection trusts every
probe; a repro that reproduces in 70% of runs makes it wander or refuse. Here each probe is
evidence, not a fact. The search keeps a posterior over the boundary: every candidate
culprit (items[1:]: the first item that reproduces) plus "no change in the range" (the whole
range clean throughout, or reproducing throughout). Outcomes are Bernoulli: at a release
past the boundary with an unknown rate p ~ Beta(rate_prior) cut to [min_rate, 1] (the
smallest rate that matters: below it, "no change" can be shown), before it with an unknown
false rate ~ Beta(false_rate_prior) (small: a clean release seldom reproduces). The rates are
integrated out (Beta-Bernoulli), so the search never needs to be told them. The next probe
is the one whose outcome is expected to tell the most about the boundary (information gain;
it may re-probe an item), K at a time for K workers; it stops when one answer reaches
`confidence` or after `max_runs`, and then names the leading candidates instead of guessing.

Pure: the probe is injected, the answer is deterministic given the seed (which only breaks
ties), and a search resumes from the observations a previous one returned.

It assumes a regression: the later side reproduces. For a fix, pass the items reversed (the
answer is then the last release that still reproduces, read from the newest end).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reprobox.core import stats
from reprobox.core.counts import check_count
from reprobox.core.protocol import Verdict

T = TypeVar("T")
Probe = Callable[[T, int], Verdict | None]  # (item, attempt) -> verdict, None to skip
# [(item, attempt), ...] -> their verdicts, in order: K probes run at once
BatchProbe = Callable[[list[tuple[T, int]]], list[Verdict | None]]
Observation = tuple[T, bool | None]  # (item, reproduced?), None: skipped (cannot test)

MAX_BRANCHES = 64  # outcome combinations a batch's choice looks through (the likeliest)
MIN_GAIN = 1e-7  # nats: a probe expected to tell less tells nothing (an untestable neighbour)
GRID = 100  # rates a side the two-rate likelihood sums over (0.005, 0.015, ..., 0.995)
MIN_SIDE = 5  # runs each side of a claimed answer needs: a rate is never read from one launch


@dataclass
class FlakyAnswer(Generic[T]):
    """What the search concluded, how sure it is, and what it cost."""

    status: str  # found | no_change | undecided
    culprit: T | None  # found: the first item that reproduces
    confidence: float  # the posterior probability of the answer (undecided: of the leader)
    no_change: float  # the posterior probability of "no change in the range"
    throughout: str | None  # no_change: "clean" or "reproduced", whichever is likelier
    runs: int  # launches, skips included
    posterior: list[tuple[T, float]]  # each candidate culprit (items[1:]) and its probability
    counts: list[tuple[T, int, int]]  # (item, reproductions, runs) of every item probed
    top: list[tuple[T | None, float]]  # undecided: the leading answers (None: no change)
    observations: list[Observation[T]] = field(default_factory=list)  # to resume from
    target: float = 0.99


class _Model:
    """The likelihood of one side's outcomes with its rate integrated out, cached by counts
    (hypotheses share them: only probed items change a side's totals)."""

    def __init__(
        self,
        n: int,
        log_prior: list[float],
        rate: tuple[float, float],
        min_rate: float,
        false_rate: tuple[float, float],
        gap: float,
    ) -> None:
        self.n, self.log_prior = n, log_prior
        self.rate, self.min_rate, self.false_rate = rate, min_rate, false_rate
        self.gap = gap  # the least excess of the rate past the boundary over the one before
        self._good: dict[tuple[int, int], tuple[float, float]] = {}
        self._bad: dict[tuple[int, int], tuple[float, float]] = {}
        self._pair: dict[tuple[int, int, int, int], tuple[float, float, float]] = {}
        self.grid = [(i + 0.5) / GRID for i in range(GRID)]
        self.logs = [(math.log(r), math.log1p(-r)) for r in self.grid]

    def pair(self, kg: int, ng: int, kb: int, nb: int) -> tuple[float, float, float]:
        """Both sides of a boundary together: log P(outcomes), and P(next reproduces) before
        and past it, with the two rates (q before, p past) uniform over the pairs where p is
        at least `min_rate` and at least `gap` above q: a change is a rise of the rate, and
        the false rate is learnt from the runs, not assumed small (a history at 40%
        throughout is no change, whatever its false rate). A midpoint sum over a grid of
        GRID rates a side; the rates are integrated out, never plugged in."""
        key = (kg, ng, kb, nb)
        if key not in self._pair:
            before = [kg * lr + (ng - kg) * l1 for lr, l1 in self.logs]
            past = [kb * lr + (nb - kb) * l1 for lr, l1 in self.logs]
            top_b, top_p = max(before), max(past)
            wb = [math.exp(v - top_b) for v in before]
            wp = [math.exp(v - top_p) for v in past]
            step = round(self.gap * GRID)
            floor = math.ceil(self.min_rate * GRID - 0.5)
            tail = [0.0] * (GRID + 1)  # sums over past rates from index i on: mass, mean
            tail_rate = [0.0] * (GRID + 1)
            for i in range(GRID - 1, -1, -1):
                tail[i] = tail[i + 1] + wp[i]
                tail_rate[i] = tail_rate[i + 1] + wp[i] * self.grid[i]
            mass = rate_before = rate_past = 0.0
            pairs = 0
            for j in range(GRID):
                start = max(j + step, floor)
                if start >= GRID:
                    break
                pairs += GRID - start
                mass += wb[j] * tail[start]
                rate_before += wb[j] * tail[start] * self.grid[j]
                rate_past += wb[j] * tail_rate[start]
            log_ml = top_b + top_p + math.log(max(mass, 1e-300)) - math.log(pairs)
            self._pair[key] = (
                (log_ml, rate_before / mass, rate_past / mass) if mass > 0 else (log_ml, 0.5, 0.5)
            )
        return self._pair[key]

    def good(self, k: int, n: int) -> tuple[float, float]:
        """Before the boundary: log P(outcomes), and P(next reproduces); rate ~ Beta."""
        if (k, n) not in self._good:
            a, b = self.false_rate
            log_ml = _log_beta(a + k, b + n - k) - _log_beta(a, b)
            self._good[(k, n)] = (log_ml, (a + k) / (a + b + n))
        return self._good[(k, n)]

    def bad(self, k: int, n: int) -> tuple[float, float]:
        """Past the boundary: the same, with the rate's Beta cut to [min_rate, 1] (a rate
        below the smallest that matters is no reproduction: "no change" can be shown)."""
        if (k, n) not in self._bad:
            a, b = self.rate
            self._bad[(k, n)] = (
                self._log_mass(a + k, b + n - k) - self._log_mass(a, b),
                math.exp(self._log_mass(a + k + 1, b + n - k) - self._log_mass(a + k, b + n - k)),
            )
        return self._bad[(k, n)]

    def _log_mass(self, a: float, b: float) -> float:
        """log of the integral of p^(a-1) (1-p)^(b-1) over [min_rate, 1]."""
        if self.min_rate <= 0:
            return _log_beta(a, b)
        upper = stats.betainc(b, a, 1.0 - self.min_rate)  # I_{1-m}(b, a): no cancellation
        return _log_beta(a, b) + math.log(max(upper, 1e-300))


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _h2(x: float) -> float:
    if x <= 0.0 or x >= 1.0:
        return 0.0
    return -x * math.log(x) - (1 - x) * math.log1p(-x)


def _posterior(
    model: _Model, k: list[int], n: list[int]
) -> tuple[list[float], list[float], list[float]]:
    """Per hypothesis: its posterior weight, and the predictive reproduction rate of a probe
    before the boundary (false) and past it (bad), both rates integrated out."""
    k_all, n_all = sum(k), sum(n)
    logs, q, p = [], [], []
    kg = ng = 0
    for h in range(model.n + 1):
        if h > 0:
            kg += k[h - 1]
            ng += n[h - 1]
        if 0 < h < model.n:
            both, pred_good, pred_bad = model.pair(kg, ng, k_all - kg, n_all - ng)
        else:  # no change: one rate throughout, clean (false rate) or reproducing
            good, pred_good = model.good(kg, ng)
            bad, pred_bad = model.bad(k_all - kg, n_all - ng)
            both = good + bad
        logs.append(model.log_prior[h] + both)
        q.append(pred_good)
        p.append(pred_bad)
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    total = math.fsum(weights)
    return [w / total for w in weights], q, p


def _predictive_and_gain(
    w: list[float], q: list[float], p: list[float]
) -> tuple[list[float], list[float]]:
    """For a probe of each item i: P(reproduces) and the expected information it gives about
    the boundary, I(H; Y_i) = H(Y_i) - E_h H(Y_i | h). Item i lies before the boundary of
    every h > i and past it for h <= i: prefix and suffix sums make this O(n)."""
    size = len(w) - 1
    before_rate = [0.0] * (size + 2)  # sum over h >= j of w_h q_h, and of w_h H(q_h)
    before_ent = [0.0] * (size + 2)
    for h in range(size, -1, -1):
        before_rate[h] = before_rate[h + 1] + w[h] * q[h]
        before_ent[h] = before_ent[h + 1] + w[h] * _h2(q[h])
    rates, gains = [], []
    past_rate = past_ent = 0.0  # sum over h <= i of w_h p_h, and of w_h H(p_h)
    for i in range(size):
        past_rate += w[i] * p[i]
        past_ent += w[i] * _h2(p[i])
        rate = min(1.0, max(0.0, past_rate + before_rate[i + 1]))
        rates.append(rate)
        gains.append(_h2(rate) - past_ent - before_ent[i + 1])
    return rates, gains


def _choose(
    model: _Model, k: list[int], n: list[int], size: int, allowed: list[bool], rng: random.Random
) -> list[int]:
    """`size` probes with the most joint information, chosen greedily: each next pick gains
    the most averaged over the outcomes of the picks before it (the same item may be picked
    twice: a re-probe)."""
    branches: list[tuple[float, list[int], list[int]]] = [(1.0, list(k), list(n))]
    picks: list[int] = []
    for _ in range(size):
        total = [0.0] * model.n
        looked = []
        for prob, bk, bn in branches:
            w, q, p = _posterior(model, bk, bn)
            rates, gains = _predictive_and_gain(w, q, p)
            looked.append(rates)
            for i, g in enumerate(gains):
                total[i] += prob * g
        options = [i for i in range(model.n) if allowed[i]]
        best = max(total[i] for i in options)
        pick = rng.choice([i for i in options if total[i] >= best - 1e-12])
        picks.append(pick)
        grown: list[tuple[float, list[int], list[int]]] = []
        for (prob, bk, bn), rates in zip(branches, looked, strict=True):
            for outcome, chance in ((1, rates[pick]), (0, 1.0 - rates[pick])):
                if chance > 0:
                    nk, nn = list(bk), list(bn)
                    nk[pick] += outcome
                    nn[pick] += 1
                    grown.append((prob * chance, nk, nn))
        branches = sorted(grown, key=lambda b: -b[0])[:MAX_BRANCHES]
    return picks


def flaky_search(
    items: Sequence[T],
    probe: Probe[T] | None = None,
    *,
    confidence: float = 0.999,
    max_runs: int = 300,
    workers: int = 1,
    seed: int = 0,
    observations: Sequence[Observation[T]] = (),
    prior_no_change: float = 0.1,
    rate_prior: tuple[float, float] = (1.0, 1.0),
    min_rate: float = 0.25,
    false_rate_prior: tuple[float, float] = (1.0, 1.0),
    min_gap: float = 0.1,
    probe_batch: BatchProbe[T] | None = None,
) -> FlakyAnswer[T]:
    """Probe until one answer (a culprit, or no change) has posterior >= `confidence`, or
    `max_runs` launches (skips included) are spent, or no probe is expected to tell more
    than MIN_GAIN (more runs would change nothing); `workers` probes a round, run through
    `probe_batch` when given (else `probe`, one after another). `observations` resumes a
    search (max_runs = 0 only reads their posterior). A probe giving None or cannot_test
    skips the item: it is counted as a run and never probed again."""
    size = len(items)
    check_search(size, workers, confidence, prior_no_change)
    if not 0 <= min_rate < 1:
        raise ValueError("min_rate must be in [0, 1)")
    log_change = math.log((1 - prior_no_change) / (size - 1))
    log_none = math.log(prior_no_change / 2)
    log_prior = [log_none, *[log_change] * (size - 1), log_none]
    model = _Model(size, log_prior, rate_prior, min_rate, false_rate_prior, min_gap)
    where = {item: i for i, item in enumerate(items)}
    k, n = [0] * size, [0] * size
    allowed = [True] * size
    seen: list[Observation[T]] = []
    tries = [0] * size

    def take(index: int, outcome: bool | None) -> None:
        tries[index] += 1
        seen.append((items[index], outcome))
        if outcome is None:
            allowed[index] = False
        else:
            k[index] += outcome
            n[index] += 1

    for item, outcome in observations:
        if item not in where:
            raise ValueError(f"observation of {item!r}, which is not in the range")
        take(where[item], outcome)
    rng = random.Random(seed)
    while True:
        w, q, p = _posterior(model, k, n)
        runs = len(seen)
        if runs >= max_runs or not any(allowed):
            break
        short = _short_of(w, n, allowed, confidence)
        if short is None:
            break  # an answer at the target, on enough runs to stand on
        if short:  # the posterior has an answer, but some side of it rests on a handful
            picks = short[: min(workers, max_runs - runs)]
        else:
            _, gains = _predictive_and_gain(w, q, p)
            if max(g for i, g in enumerate(gains) if allowed[i]) < MIN_GAIN:
                break  # no probe left can tell more (the boundary sits beside an untestable item)
            picks = _choose(model, k, n, min(workers, max_runs - runs), allowed, rng)
        jobs = [(items[i], tries[i] + 1 + picks[:j].count(i)) for j, i in enumerate(picks)]
        if probe_batch is not None:
            verdicts = probe_batch(jobs)
        elif probe is not None:
            verdicts = [probe(item, attempt) for item, attempt in jobs]
        else:
            raise ValueError("flaky_search needs a probe or a probe_batch")
        for index, verdict in zip(picks, verdicts, strict=True):
            usable = verdict in (Verdict.REPRODUCED, Verdict.CLEAN)
            take(index, (verdict is Verdict.REPRODUCED) if usable else None)
    return _answer(items, w, k, n, seen, confidence, _short_of(w, n, allowed, confidence) is None)


def check_search(size: int, workers: int, confidence: float, prior_no_change: float) -> None:
    """ValueError for what no posterior search can take (shared with bisect.changepoint)."""
    if size < 2:
        raise ValueError("need at least two items to bisect")
    check_count("--workers", workers)
    if not 0.5 < confidence < 1:
        raise ValueError("confidence must be in (0.5, 1)")
    if not 0 < prior_no_change < 1:
        raise ValueError("prior_no_change must be in (0, 1)")


def _short_of(w: list[float], n: list[int], allowed: list[bool], target: float) -> list[int] | None:
    """Whether the posterior's answer can be claimed: None when it can (stop); [] when
    there is none yet (search on); else the items to probe first, since a side of the answer
    rests on fewer than MIN_SIDE runs (a false rate, or a rate that only looks constant, is
    not measured by one launch): the two items beside a culprit, or the two ends for "no
    change"."""
    size = len(n)
    best = max(range(1, size), key=lambda h: w[h])
    if w[best] >= target:
        sides = [(sum(n[:best]), best - 1), (sum(n[best:]), best)]
    elif w[0] + w[size] >= target:
        sides = [(n[0], 0), (n[size - 1], size - 1)]
    else:
        return []
    picks = [at for count, at in sides if count < MIN_SIDE and allowed[at]]
    return picks or None


def _answer(
    items: Sequence[T],
    w: list[float],
    k: list[int],
    n: list[int],
    seen: list[Observation[T]],
    target: float,
    enough: bool = True,
) -> FlakyAnswer[T]:
    size = len(items)
    none = w[0] + w[size]
    best = max(range(1, size), key=lambda h: (w[h], -h))
    ranked: list[tuple[T | None, float]] = sorted(
        [(items[h], w[h]) for h in range(1, size)] + [(None, none)], key=lambda t: -t[1]
    )
    if none >= target and enough:
        status, culprit, conf = "no_change", None, none
    elif w[best] >= target and enough:
        status, culprit, conf = "found", items[best], w[best]
    else:
        status, culprit, conf = "undecided", None, ranked[0][1]
    top: list[tuple[T | None, float]] = []
    if status == "undecided":  # the leaders, until they hold the target between them
        held = 0.0
        for item, prob in ranked:
            top.append((item, prob))
            held += prob
            if held >= target or len(top) >= 5:
                break
    return FlakyAnswer(
        status=status,
        culprit=culprit,
        confidence=conf,
        no_change=none,
        throughout=("reproduced" if w[0] > w[size] else "clean") if status == "no_change" else None,
        runs=len(seen),
        posterior=[(items[h], w[h]) for h in range(1, size)],
        counts=[(items[i], k[i], n[i]) for i in range(size) if n[i]],
        top=top,
        observations=seen,
        target=target,
    )
