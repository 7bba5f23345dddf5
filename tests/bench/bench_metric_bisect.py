"""Accuracy of the flake-aware bisect on the noise users have: drifting metrics and pass/fail
flakes with high false rates. Simulated histories, the real search code.

Metric cells: N releases, a culprit drawn uniformly from releases[1:]; a launch's metric is
N(0, 1) before it and N(shift, spread) from it on (shift in sd of the "before" spread; spread 1
or 1.5: with and without a shift in spread); "none" rows have no change. Searched by
`bisect.changepoint` (what `reprobox bisect` runs for a variant whose declared test reads a
metric), at its defaults: confidence 0.99, min shift 0.25 sd, budget 2000 launches.

Pass/fail cells: the same histories as bench_noisy_bisect.py with false rates 0.2 and 0.4 (a
metric judged launch by launch against a threshold it overlaps: the issue's 40% / 60%),
searched by `bisect.flaky` at its defaults (what a variant declaring `test = "sprt"` gets).

Each cell: accuracy (the right culprit, or "no change" when there is none), `wrong` (a wrong
culprit or a wrong "no change" printed as found: the worst outcome), `refused` (undecided),
mean and 95th-percentile launches, and `bound`: no search reaches accuracy 0.99 in a change
row with fewer mean launches than (log2(N-1) - h(0.01) - 0.01 log2(N-2)) / C (Fano's
inequality; C the most one launch can tell about which side of the change a release is on,
with the levels known), and `x bound` the ratio.

    .venv/bin/nox -s bench -- metric_bisect [--trials 300] [--sizes 8,32] [--kinds metric,flake]
        [--table]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from multiprocessing import Pool

from common import emit

from reprobox.bisect.changepoint import shift_search
from reprobox.bisect.flaky import flaky_search
from reprobox.core.protocol import Verdict

SHIFTS = (0.25, 0.5, 1.0)
SPREADS = (1.0, 1.5)
FLAKES = ((0.2, 0.7), (0.4, 0.6), (0.4, 0.9))  # (false rate before, rate after)


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


def _p95(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _metric_trial(size: int, shift: float | None, spread: float, seed: int) -> tuple[str, int]:
    rng = random.Random(seed)
    culprit = rng.randrange(1, size) if shift is not None else None

    def probe(jobs: list[tuple[int, int]]) -> list[float | None]:
        return [
            rng.gauss(shift, spread) if culprit is not None and shift is not None and i >= culprit
            else rng.gauss(0.0, 1.0)
            for i, _ in jobs
        ]  # fmt: skip

    answer = shift_search(list(range(size)), probe, seed=seed, max_runs=2000)
    return _grade(answer.status, answer.culprit, culprit), answer.runs


def _flake_trial(size: int, p: float, false: float, change: bool, seed: int) -> tuple[str, int]:
    rng = random.Random(seed)
    culprit = rng.randrange(1, size) if change else None

    def probe(index: int, attempt: int) -> Verdict:
        bad = culprit is not None and index >= culprit
        return Verdict.REPRODUCED if rng.random() < (p if bad else false) else Verdict.CLEAN

    answer = flaky_search(list(range(size)), probe, seed=seed)
    return _grade(answer.status, answer.culprit, culprit), answer.runs


def _grade(status: str, said: int | None, culprit: int | None) -> str:
    if status == "undecided":
        return "refused"
    if status == "no_change":
        return "right" if culprit is None else "wrong"
    return "right" if said == culprit else "wrong"


def cell(spec: tuple) -> dict:
    kind, size, a, b, trials, seed = spec
    results = []
    for t in range(trials):
        trial_seed = random.Random(f"{kind}/{size}/{a}/{b}/{seed}/{t}").randrange(1 << 30)
        if kind == "metric":
            results.append(_metric_trial(size, a, b, trial_seed))
        else:
            results.append(_flake_trial(size, b, a, a != b, trial_seed))
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
    }
    if kind == "metric":
        out.update(shift=a, spread=b)
        out["bound"] = round(bound(size, metric_capacity(a, b)), 1) if a is not None else None
    else:
        out.update(false=a, p=b)
        out["bound"] = round(bound(size, flake_capacity(b, a)), 1) if a != b else None
    if out["bound"]:
        out["x_bound"] = round(out["mean_runs"] / out["bound"], 2)
    return out


def specs(sizes: list[int], trials: int, seed: int, kinds: str = "metric,flake") -> list[tuple]:
    rows: list[tuple] = []
    for n in sizes:
        rows += [("metric", n, s, sp, trials, seed) for s in SHIFTS for sp in SPREADS]
        rows.append(("metric", n, None, 1.0, trials, seed))
        rows += [("flake", n, f, p, trials, seed) for f, p in FLAKES]
        rows += [("flake", n, f, f, trials, seed) for f in (0.2, 0.4)]  # no change
    return [row for row in rows if row[0] in kinds.split(",")]


def table(rows: list[dict]) -> str:
    lines = [
        "| kind | N | history | accuracy | wrong as certain | refused | mean runs (p95) "
        "| bound | x bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "metric":
            what = (
                "no change"
                if r["shift"] is None
                else f"shift {r['shift']:g} sd"
                + (f", spread x{r['spread']:g}" if r["spread"] != 1 else "")
            )
        else:
            what = (
                f"no change, rate {r['false']:g}"
                if r["false"] == r["p"]
                else f"{r['false']:g} -> {r['p']:g}"
            )
        lines.append(
            f"| {r['kind']} | {r['n']} | {what} | {r['accuracy']:.3f} | {r['wrong']:.3f} | "
            f"{r['refused']:.3f} | {r['mean_runs']:g} ({r['p95_runs']}) | "
            f"{r['bound'] if r['bound'] else '-'} | {r.get('x_bound', '-')} |"
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
    args = parser.parse_args()
    started = time.perf_counter()
    todo = specs([int(s) for s in args.sizes.split(",")], args.trials, args.seed, args.kinds)
    with Pool(args.processes) as pool:
        rows = []
        for row in pool.imap(cell, todo):
            rows.append(row)
            print(f"done {row['kind']} N={row['n']}", file=sys.stderr, flush=True)
    wall = round(time.perf_counter() - started, 1)
    if args.table:
        print(table(rows))
        print(f"\n{args.trials} trials a cell (seed {args.seed}); {wall} s")
    else:
        emit({"trials": args.trials, "wall_s": wall, "cells": rows})


if __name__ == "__main__":
    main()
