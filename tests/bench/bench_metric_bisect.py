"""Accuracy of the flake-aware bisect on the noise users have: drifting metrics and pass/fail
flakes with high false rates. Simulated histories, the real search code.

Metric cells: N releases, a culprit drawn uniformly from releases[1:]; a launch's metric is
N(0, 1) before it and N(shift, spread) from it on (shift in sd of the "before" spread; spread 1
or 1.5: with and without a shift in spread); "none" rows have no change, and the "spread x1.5
alone" rows a release that widens the spread and leaves the mean where it was (the right
answer: no change, since the search, as the declared test, asks about the mean). Searched by
`bisect.changepoint` (what `reprobox bisect` runs for a variant whose declared test reads a
metric), at its defaults: confidence 0.999, min shift 0.25 sd, budget 8000 launches
(`strategy.metric_budget`: 500 / min shift^2).

Heavy-tailed cells (`--noise t3`, or `both`): the same metric histories with Student-t noise
of 3 degrees of freedom scaled to the same sd, the shape a real training metric had
(transformers' eval-loss gap in repros/ved_double_shift: three launches of ten near -3 sd
where 53 before had none below -2 sd). The search's model is Gaussian; these cells check
that a tail it does not expect never makes it certain of a wrong answer. Their bounds are
not printed: the Gaussian ones do not bound a search on t noise.

Pass/fail cells: false rates 0.2 and 0.4 (a metric judged launch by launch against a threshold
it overlaps: the issue's 40% / 60%), searched by `bisect.flaky` at its defaults (what a variant
declaring `test = "sprt"` gets), budget 300.

Each cell: accuracy (the right culprit, or "no change" when there is none), `wrong` (a wrong
culprit or a wrong "no change" printed as found: the worst outcome), `refused` (undecided),
mean and 95th-percentile launches, and two lower bounds on the mean launches of any search:
- `fano`: for accuracy 0.99, (log2(N-1) - h(0.01) - 0.01 log2(N-2)) / C (Fano's inequality;
  C the most one launch can tell about which side of the change a release is on, the levels
  known): what finding one of N - 1 culprits costs;
- `delta_bound`: for answers wrong at most 1 - confidence of the time (the change-of-measure
  bound, Garivier & Kaufmann 2016): the culprit must be told from its two neighbours, with
  the levels unknown (`delta_bound`); for "no change", every smallest change that counts
  must be ruled out (`no_change_bound`). Above the budget: no search decides that cell.
`x bound` is mean runs over the larger of the two.

    .venv/bin/nox -s bench -- metric_bisect [--trials 300] [--sizes 8,32] [--kinds metric,flake]
        [--max-runs 8000] [--flake-max-runs 300] [--confidence 0.999] [--table]
        [--noise normal|t3|both] [--shifts 0.25,0.5,1,none] [--spread-alone 1.5]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from multiprocessing import Pool

from common import emit

from reprobox.bisect.changepoint import shift_search
from reprobox.bisect.flaky import flaky_search
from reprobox.bisect.strategy import metric_budget
from reprobox.core.protocol import Verdict

SHIFTS = (0.25, 0.5, 1.0)
SPREADS = (1.0, 1.5)
FLAKES = ((0.2, 0.7), (0.4, 0.6), (0.4, 0.9))  # (false rate before, rate after)
MIN_SHIFT, MIN_GAP, MIN_RATE = 0.25, 0.1, 0.25  # the searches' defaults: the least change
METRIC_RUNS = metric_budget(MIN_SHIFT)  # what `reprobox bisect` gives a metric search


def _h2(x: float) -> float:
    return 0.0 if x <= 0 or x >= 1 else -x * math.log2(x) - (1 - x) * math.log2(1 - x)


def _pdf(x: float, mu: float, sd: float) -> float:
    return math.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))


def metric_capacity(shift: float, spread: float) -> float:
    """max over P(after) of I(side; one launch's value), in bits, by quadrature."""
    lo, hi = -8.0, shift + 8.0 * spread
    steps = 4000
    dx = (hi - lo) / steps
    best = 0.0
    for k in range(1, 20):
        pi = k / 20
        info = 0.0
        for i in range(steps):
            x = lo + (i + 0.5) * dx
            a, b = (1 - pi) * _pdf(x, 0, 1), pi * _pdf(x, shift, spread)
            m = a + b
            if a > 0:
                info += a * math.log2(a / ((1 - pi) * m)) * dx
            if b > 0:
                info += b * math.log2(b / (pi * m)) * dx
        best = max(best, info)
    return best


def flake_capacity(p: float, false: float) -> float:
    best = 0.0
    for k in range(1, 100):
        pi = k / 100
        out = pi * p + (1 - pi) * false
        best = max(best, _h2(out) - pi * _h2(p) - (1 - pi) * _h2(false))
    return best


def bound(size: int, capacity: float, accuracy: float = 0.99) -> float:
    need = math.log2(size - 1) - _h2(1 - accuracy) - (1 - accuracy) * math.log2(size - 2)
    return need / capacity


def _kl_bern(p: float, q: float) -> float:
    q = min(max(q, 1e-12), 1 - 1e-12)
    out = p * math.log(p / q) if p > 0 else 0.0
    return out + ((1 - p) * math.log((1 - p) / (1 - q)) if p < 1 else 0.0)


def _kl_norm(m1: float, s1: float, m2: float, s2: float) -> float:
    return math.log(s2 / s1) + (s1 * s1 + (m1 - m2) ** 2) / (2 * s2 * s2) - 0.5


def _least(f: Callable[[float], float], lo: float, hi: float) -> float:
    """min of a convex f on [lo, hi] (golden section)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(80):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return min(fc, fd, f(lo), f(hi))


def _closest(kind: str, a: float, b: float, w: tuple[float, float, float, float]) -> float:
    """Per launch, the least weighted divergence from the truth to an answer that differs:
    the culprit h one release later (h joins the side before), one earlier (h - 1 joins the
    side after), or no change; each alternative's levels moved to fit, within what the
    search calls a change (a shift of MIN_SHIFT sd; a rate MIN_GAP above the other and at
    least MIN_RATE), its spreads as the truth's. For a metric, also the truth's change of
    spread with the mean left where it was: the search answers whether the *mean* changed
    (what a declared t-test reads), so a release that changes the spread alone is no
    change, and a search must rule that out as well. w: the shares of launches at release
    h - 1 (x), h (y), before h - 1 (u) and after h (v). Leaving alternatives out only lowers
    the bound, so it stays one."""
    x, y, u, v = w
    if kind == "metric":
        d, s, m = a, b, MIN_SHIFT

        def later(g: float) -> float:  # release h at the level before, g; after: max(d, g+m)
            after = max(d, g + m)
            return (
                (x + u) * _kl_norm(0, 1, g, 1)
                + y * _kl_norm(d, s, g, 1)
                + v * _kl_norm(d, s, after, s)
            )

        def earlier(c: float) -> float:  # release h - 1 at the level after, c
            before = min(0.0, c - m)
            return (
                u * _kl_norm(0, 1, before, 1)
                + x * _kl_norm(0, 1, c, s)
                + (y + v) * _kl_norm(d, s, c, s)
            )

        def none(c: float) -> float:  # one level c, one spread (the best for c)
            n1, n2 = x + u, y + v
            var = (n1 * (1 + c * c) + n2 * (s * s + (d - c) ** 2)) / max(n1 + n2, 1e-12)
            sd = math.sqrt(var)
            return n1 * _kl_norm(0, 1, c, sd) + n2 * _kl_norm(d, s, c, sd)

        def spread_alone(c: float) -> float:  # one level c, the spread changing at h
            return (x + u) * _kl_norm(0, 1, c, 1) + (y + v) * _kl_norm(d, s, c, s)

        lo, hi = -3.0, d + 3.0
        return min(
            _least(later, lo, hi),
            _least(earlier, lo, hi),
            _least(none, lo, hi),
            _least(spread_alone, lo, hi),
        )
    q, p = a, b

    def later_r(r: float) -> float:  # release h at the rate before, r
        after = max(p, r + MIN_GAP, MIN_RATE)
        if after > 1:
            return math.inf
        return (x + u) * _kl_bern(q, r) + y * _kl_bern(p, r) + v * _kl_bern(p, after)

    def earlier_r(r: float) -> float:  # release h - 1 at the rate after, r
        before = max(0.0, min(q, r - MIN_GAP))
        return u * _kl_bern(q, before) + x * _kl_bern(q, r) + (y + v) * _kl_bern(p, r)

    def none_r(r: float) -> float:
        return (x + u) * _kl_bern(q, r) + (y + v) * _kl_bern(p, r)

    return min(
        _least(later_r, 1e-6, 1 - MIN_GAP),
        _least(earlier_r, MIN_RATE, 1 - 1e-6),
        _least(none_r, 1e-6, 1 - 1e-6),
    )


def delta_bound(kind: str, a: float, b: float, wrong: float) -> float:
    """The fewest launches any search whose answers are wrong at most `wrong` of the time
    needs, on average, where there is a change (the change-of-measure bound, Garivier &
    Kaufmann 2016): sum_i E[n_i] KL_i(truth, alternative) >= kl(wrong, 1 - wrong) for every
    alternative with another answer, so E[n] >= kl / max over the shares of min over the
    alternatives (`_closest`). Searched on a grid of shares, then by coordinate ascent (the
    min of linear functions is concave: its local maximum is the maximum); rounded down by
    1% so that the search's own tolerance never raises it.
    metric: a = shift (sd), b = spread after; flake: a = false rate, b = rate after."""
    kl = (1 - 2 * wrong) * math.log((1 - wrong) / wrong)
    steps = 12
    best, at = -1.0, (0.25, 0.25, 0.25, 0.25)
    for i in range(steps + 1):
        for j in range(steps + 1 - i):
            for k in range(steps + 1 - i - j):
                w = (i / steps, j / steps, k / steps, (steps - i - j - k) / steps)
                value = _closest(kind, a, b, w)
                if value > best:
                    best, at = value, w
    step = 1 / steps
    while step > 1e-4:
        moved = False
        for src in range(4):
            for dst in range(4):
                if src == dst or at[src] < step:
                    continue
                w = list(at)
                w[src] -= step
                w[dst] += step
                value = _closest(kind, a, b, (w[0], w[1], w[2], w[3]))
                if value > best:
                    best, at, moved = value, (w[0], w[1], w[2], w[3]), True
        if not moved:
            step /= 2
    return 0.99 * kl / best


def no_change_bound(kind: str, level: float, wrong: float) -> float:
    """The same bound for "no change": every culprit with the smallest change that counts
    (a shift of MIN_SHIFT sd; a rise of the rate by MIN_GAP to at least MIN_RATE) must be
    ruled out. Each alternative splits the launches into a side before and after it; only
    the first and last releases are on one side of every alternative, so the launches go
    there: a fraction f at the first. metric: level = the last release's spread over the
    first's, s (the shift in the first's sd); flake: level = the rate."""
    kl = (1 - 2 * wrong) * math.log((1 - wrong) / wrong)
    if kind == "metric":
        # min over the levels' split of f a^2 / 2 + (1 - f) (m - a)^2 / (2 s^2) is
        # m^2 / (2 (1/f + s^2/(1 - f))), largest at f = 1 / (1 + s): m^2 / (2 (1 + s)^2)
        return kl * 2 * (1 + level) ** 2 / MIN_SHIFT**2
    best = 0.0
    for i in range(1, 100):
        f = i / 100
        least = math.inf
        for k in range(0, 1001):
            q = k / 1000
            p = max(q + MIN_GAP, MIN_RATE)
            if p > 1:
                break
            least = min(least, f * _kl_bern(level, q) + (1 - f) * _kl_bern(level, p))
        best = max(best, least)
    return kl / best


def _p95(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _t3(rng: random.Random) -> float:
    """Student-t noise with 3 degrees of freedom, scaled to sd 1 (its variance is 3)."""
    return rng.gauss(0.0, 1.0) / math.sqrt(rng.gammavariate(1.5, 2.0) / 3) / math.sqrt(3)


def _metric_trial(
    size: int,
    shift: float | None,
    spread: float,
    seed: int,
    budget: tuple[int, float],
    noise: str = "normal",
) -> tuple[str, int]:
    rng = random.Random(seed)
    culprit = rng.randrange(1, size) if shift is not None else None

    def draw() -> float:
        return rng.gauss(0.0, 1.0) if noise == "normal" else _t3(rng)

    def probe(jobs: list[tuple[int, int]]) -> list[float | None]:
        return [
            shift + spread * draw() if culprit is not None and shift is not None and i >= culprit
            else draw()
            for i, _ in jobs
        ]  # fmt: skip

    answer = shift_search(
        list(range(size)), probe, seed=seed, max_runs=budget[0], confidence=budget[1]
    )
    return _grade(answer.status, answer.culprit, culprit if shift else None), answer.runs


def _flake_trial(
    size: int, p: float, false: float, change: bool, seed: int, budget: tuple[int, float]
) -> tuple[str, int]:
    rng = random.Random(seed)
    culprit = rng.randrange(1, size) if change else None

    def probe(index: int, attempt: int) -> Verdict:
        bad = culprit is not None and index >= culprit
        return Verdict.REPRODUCED if rng.random() < (p if bad else false) else Verdict.CLEAN

    answer = flaky_search(
        list(range(size)), probe, seed=seed, max_runs=budget[0], confidence=budget[1]
    )
    return _grade(answer.status, answer.culprit, culprit), answer.runs


def _grade(status: str, said: int | None, culprit: int | None) -> str:
    if status == "undecided":
        return "refused"
    if status == "no_change":
        return "right" if culprit is None else "wrong"
    return "right" if said == culprit else "wrong"


def cell(spec: tuple) -> dict:
    kind, size, a, b, trials, seed, budget, *rest = spec
    noise = rest[0] if rest else "normal"
    tag = "" if noise == "normal" else f"/{noise}"  # normal cells keep their seeds
    results = []
    for t in range(trials):
        trial_seed = random.Random(f"{kind}/{size}/{a}/{b}/{seed}/{t}{tag}").randrange(1 << 30)
        if kind == "metric":
            results.append(_metric_trial(size, a, b, trial_seed, budget, noise))
        else:
            results.append(_flake_trial(size, b, a, a != b, trial_seed, budget))
    runs = [r for _, r in results]
    out = {
        "kind": kind,
        "n": size,
        "trials": trials,
        "accuracy": round(sum(g == "right" for g, _ in results) / trials, 4),
        "wrong": round(sum(g == "wrong" for g, _ in results) / trials, 4),
        "refused": round(sum(g == "refused" for g, _ in results) / trials, 4),
        "mean_runs": round(sum(runs) / trials, 1),
        "p95_runs": _p95(runs),
        "max_runs": budget[0],
        "confidence": budget[1],
    }
    changes = bool(a) if kind == "metric" else a != b  # a shift of 0: the spread alone
    if kind == "metric":
        out.update(shift=a, spread=b, noise=noise)
    else:
        out.update(false=a, p=b)
    if noise != "normal":
        return out  # no bound: see the module's docstring
    if changes:
        capacity = metric_capacity(a, b) if kind == "metric" else flake_capacity(b, a)
        out["fano"] = round(bound(size, capacity), 1)
        out["delta_bound"] = round(delta_bound(kind, a, b, 1 - budget[1]), 1)
        out["bound"] = max(out["fano"], out["delta_bound"])
    else:
        out["delta_bound"] = round(no_change_bound(kind, b, 1 - budget[1]), 1)
        out["bound"] = out["delta_bound"]
    out["x_bound"] = round(out["mean_runs"] / out["bound"], 2)
    return out


def specs(
    sizes: list[int],
    trials: int,
    seed: int,
    kinds: str = "metric,flake",
    budgets: dict[str, tuple[int, float]] | None = None,
    noise: str = "normal",
    shifts: tuple[float | None, ...] = (*SHIFTS, None),
    alone: tuple[float, ...] = (1.5,),
) -> list[tuple]:
    """Every cell: (kind, N, a, b, trials, seed, (max runs, confidence)[, noise]); metric
    cells only for `shifts` (None: no change, and the spread changed by each of `alone`
    with the mean left where it was)."""
    budgets = budgets or {"metric": (METRIC_RUNS, 0.999), "flake": (300, 0.999)}
    rows: list[tuple] = []
    for n in sizes:
        m, f = budgets["metric"], budgets["flake"]
        if noise in ("normal", "both"):
            rows += [("metric", n, s, sp, trials, seed, m) for s in SHIFTS for sp in SPREADS]
            rows.append(("metric", n, None, 1.0, trials, seed, m))
            rows += [("metric", n, 0.0, sp, trials, seed, m) for sp in alone]  # spread alone
            rows += [("flake", n, fr, p, trials, seed, f) for fr, p in FLAKES]
            rows += [("flake", n, fr, fr, trials, seed, f) for fr in (0.2, 0.4)]  # no change
        if noise in ("t3", "both"):
            rows += [("metric", n, s, 1.0, trials, seed, m, "t3") for s in (*SHIFTS, None)]
    return [
        row
        for row in rows
        if row[0] in kinds.split(",") and (row[0] != "metric" or (row[2] or None) in shifts)
    ]


def table(rows: list[dict]) -> str:
    lines = [
        "| kind | N | history | accuracy | wrong as certain | refused | mean runs (p95) "
        "| Fano bound | wrong-rate bound | x bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "metric":
            what = (
                "no change"
                if r["shift"] is None
                else f"spread x{r['spread']:g} alone: no change of the mean"
                if r["shift"] == 0
                else f"shift {r['shift']:g} sd"
                + (f", spread x{r['spread']:g}" if r["spread"] != 1 else "")
            )
            what += ", t3 noise" if r.get("noise", "normal") != "normal" else ""
        else:
            what = (
                f"no change, rate {r['false']:g}"
                if r["false"] == r["p"]
                else f"{r['false']:g} -> {r['p']:g}"
            )
        over = r.get("delta_bound", 0) > r["max_runs"]
        lines.append(
            f"| {r['kind']} | {r['n']} | {what} | {r['accuracy']:.3f} | {r['wrong']:.3f} | "
            f"{r['refused']:.3f} | {r['mean_runs']:g} ({r['p95_runs']}) | "
            f"{r.get('fano', '-')} | {r.get('delta_bound', '-')}"
            + (" (over the budget: no search decides it)" if over else "")
            + f" | {r.get('x_bound', '-')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--sizes", default="8,32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--kinds", default="metric,flake", help="metric, flake or both")
    parser.add_argument("--table", action="store_true", help="a markdown table, not JSON")
    parser.add_argument(
        "--max-runs", type=int, default=METRIC_RUNS, help="a metric search's budget"
    )
    parser.add_argument("--flake-max-runs", type=int, default=300, help="a pass/fail search's")
    parser.add_argument("--confidence", type=float, default=0.999)
    parser.add_argument("--noise", default="normal", choices=("normal", "t3", "both"))
    parser.add_argument(
        "--shifts", default="0.25,0.5,1,none", help="the metric cells' shifts (none: no change)"
    )
    parser.add_argument(
        "--spread-alone", default="1.5", help="no change's cells whose spread alone changes"
    )
    args = parser.parse_args()
    shifts = tuple(None if s == "none" else float(s) for s in args.shifts.split(","))
    started = time.perf_counter()
    budgets = {
        "metric": (args.max_runs, args.confidence),
        "flake": (args.flake_max_runs, args.confidence),
    }
    sizes = [int(s) for s in args.sizes.split(",")]
    alone = tuple(float(s) for s in args.spread_alone.split(","))
    todo = specs(sizes, args.trials, args.seed, args.kinds, budgets, args.noise, shifts, alone)
    with Pool(args.processes) as pool:
        rows = []
        for row in pool.imap(cell, todo):
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)  # kept if the run is cut
    wall = round(time.perf_counter() - started, 1)
    if args.table:
        print(table(rows))
        print(
            f"\n{args.trials} trials a cell (seed {args.seed}), confidence {args.confidence}, "
            f"budget {args.max_runs} launches (metric) and {args.flake_max_runs} (pass/fail); "
            f"{wall} s"
        )
    else:
        emit({"trials": args.trials, "wall_s": wall, "cells": rows})


if __name__ == "__main__":
    main()
