"""Accuracy of bisection under noise: simulated histories, the real search code.

Each trial is a history of N releases; from a culprit drawn uniformly from releases[1:] on, a
probe reproduces with rate p, before it with a false rate (or no change in the range: all
releases clean at the false rate, or all reproducing at p = 0.7). Compared: plain bisection
(bisect.search.bisect, --confirm 1, as `reprobox bisect` runs it), the same with every probe
repeated 3x or 5x and the majority taken, and the flake-aware search (bisect.flaky, its
defaults: confidence 0.99, max 300 runs). Accuracy: the right culprit, or "no change" when
there is none (a refusal, "flaky" or "ambiguous" or "undecided", is not right). Runs: every
launch, repeats included.

    .venv/bin/nox -s bench -- noisy_bisect [--trials 1000] [--sizes 8,32,128] [--table]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable

from common import emit

from reprobox.bisect import search
from reprobox.bisect.flaky import flaky_search
from reprobox.core.protocol import Verdict

RATES = (1.0, 0.9, 0.7, 0.5)
FALSE_RATES = (0.0, 0.05)
METHODS = ("bisect", "bisect_3x", "bisect_5x", "flaky")
Outcome = Callable[[int], bool]  # release index -> reproduced this time?


def _history(size: int, culprit: int | None, rate: float, false: float, rng: random.Random):
    def once(index: int) -> bool:
        bad = culprit is not None and index >= culprit
        return rng.random() < (rate if bad else false)

    return once


def _bisect(size: int, once: Outcome, repeats: int) -> tuple[str | int, int]:
    """Plain bisection on majority-of-`repeats` probes: (answer, runs)."""
    runs = 0

    def probe(index: int, attempt: int) -> Verdict:
        nonlocal runs
        runs += repeats
        votes = sum(once(index) for _ in range(repeats))
        return Verdict.REPRODUCED if votes * 2 > repeats else Verdict.CLEAN

    try:
        result = search.bisect(list(range(size)), probe, confirm=1)
    except search.SearchError as exc:
        return ("no_change" if exc.same_ends else "refused"), runs
    if result.status != "found":
        return "refused", runs
    return result.first_end, runs


def _flaky(size: int, once: Outcome, seed: int) -> tuple[str | int, int]:
    def probe(index: int, attempt: int) -> Verdict:
        return Verdict.REPRODUCED if once(index) else Verdict.CLEAN

    answer = flaky_search(list(range(size)), probe, seed=seed)
    if answer.status == "found":
        assert answer.culprit is not None
        return answer.culprit, answer.runs
    return answer.status, answer.runs


def _p95(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def cell(size: int, rate: float, false: float, change: str, trials: int, seed: int) -> dict:
    """One row: every method on the same `trials` histories (one culprit each)."""
    out: dict = {"n": size, "p": rate, "false": false, "change": change, "trials": trials}
    for method in METHODS:
        rng = random.Random(f"{seed}/{size}/{rate}/{false}/{change}/{method}")
        right, runs = 0, []
        for _ in range(trials):
            culprit = rng.randrange(1, size) if change == "yes" else None
            if change == "all reproduce":
                culprit = 0
            once = _history(size, culprit, rate, false, rng)
            if method == "flaky":
                answer, cost = _flaky(size, once, rng.randrange(1 << 30))
            else:
                answer, cost = _bisect(size, once, {"bisect": 1, "bisect_3x": 3}.get(method, 5))
            right += answer == (culprit if change == "yes" else "no_change")
            runs.append(cost)
        out[method] = {
            "accuracy": round(right / trials, 4),
            "mean_runs": round(sum(runs) / trials, 1),
            "p95_runs": _p95(runs),
        }
    out["flaky_over_5x_runs"] = round(out["flaky"]["mean_runs"] / out["bisect_5x"]["mean_runs"], 2)
    return out


def cells(sizes: list[int]) -> list[tuple[int, float, float, str]]:
    rows = [(n, p, f, "yes") for n in sizes for p in RATES for f in FALSE_RATES]
    rows += [(n, 0.0, f, "none: all clean") for n in sizes for f in FALSE_RATES]
    rows += [(n, 0.7, 0.0, "all reproduce") for n in sizes]
    return rows


def table(rows: list[dict]) -> str:
    head = "| N | p | false | change | " + " | ".join(METHODS) + " | flaky / 5x runs |"
    lines = [head, "|" + "---|" * (5 + len(METHODS))]
    for r in rows:
        figures = [
            f"{r[m]['accuracy']:.3f} ({r[m]['mean_runs']:g}, {r[m]['p95_runs']})" for m in METHODS
        ]
        p = "-" if r["change"].startswith("none") else f"{r['p']:g}"
        lines.append(
            f"| {r['n']} | {p} | {r['false']:g} | {r['change']} | "
            + " | ".join(figures)
            + f" | {r['flaky_over_5x_runs']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sizes", default="8,32,128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="a markdown table, not JSON")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for size, rate, false, change in cells([int(s) for s in args.sizes.split(",")]):
        rows.append(cell(size, rate, false, change, args.trials, args.seed))
        print(f"done N={size} p={rate} false={false} {change}", file=sys.stderr, flush=True)
    wall = round(time.perf_counter() - started, 1)
    if args.table:
        print(table(rows))
        print(
            f"\n{args.trials} trials a cell; accuracy (mean runs, 95th-percentile runs); {wall} s"
        )
    else:
        emit({"trials": args.trials, "wall_s": wall, "cells": rows})


if __name__ == "__main__":
    main()
