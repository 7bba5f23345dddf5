"""Accuracy of bisection under noise: simulated histories, the real search code.

Each trial is a history of N releases; from a culprit drawn uniformly from releases[1:] on, a
probe reproduces with rate p, before it with a false rate (or no change in the range: all
releases clean at the false rate, or all reproducing at p = 0.7). Compared: plain bisection
as `reprobox bisect` runs it (bisect.search.bisect, then the driver's verify probes over each
side, checks.verify_sides' picks) with --confirm 1 (`bisect_c1`, the default until the
confirmation became 2) and --confirm 2 (`bisect`, the default), bisection with every probe
repeated 3x or 5x and the majority taken (--confirm 1, no verify), and the flake-aware search
(bisect.flaky, its defaults: confidence 0.99, max 300 runs). Accuracy: the right culprit, or
"no change" when there is none (a refusal, "flaky" or "ambiguous" or "undecided", is not
right); `wrong` is how often a method printed a wrong culprit as found (exit 0). Runs: every
launch, repeats included. `bound`: no method reaches accuracy 0.99 in a change row with fewer
mean runs than (log2(N-1) - h(0.01) - 0.01 log2(N-2)) / C (Fano's inequality; C the most one
launch can tell about the culprit, with p and the false rate known).

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

from reprobox.bisect import checks, search
from reprobox.bisect.flaky import flaky_search
from reprobox.core.protocol import Verdict

RATES = (1.0, 0.9, 0.7, 0.5)
FALSE_RATES = (0.0, 0.05)
METHODS = ("bisect_c1", "bisect", "bisect_3x", "bisect_5x", "flaky")
PLAIN = {"bisect_c1": 1, "bisect": 2}  # --confirm
Outcome = Callable[[int], bool]  # release index -> reproduced this time?


def _history(size: int, culprit: int | None, rate: float, false: float, rng: random.Random):
    def once(index: int) -> bool:
        bad = culprit is not None and index >= culprit
        return rng.random() < (rate if bad else false)

    return once


def _bisect(
    size: int, once: Outcome, repeats: int, confirm: int = 1, verify: bool = False
) -> tuple[str | int, int]:
    """Plain bisection on majority-of-`repeats` probes, with the driver's verify probes when
    `verify` (a contradiction: non-monotone, refused): (answer, runs)."""
    runs, seen = 0, set()

    def probe(index: int, attempt: int) -> Verdict:
        nonlocal runs
        runs += repeats
        seen.add(index)
        votes = sum(once(index) for _ in range(repeats))
        return Verdict.REPRODUCED if votes * 2 > repeats else Verdict.CLEAN

    try:
        result = search.bisect(list(range(size)), probe, confirm=confirm)
    except search.SearchError as exc:
        return ("no_change" if exc.same_ends else "refused"), runs
    if result.status != "found":
        return "refused", runs
    lo, hi = result.last_start, result.first_end
    k = checks.default_verify(size) if verify else 0
    untried = [i for i in range(size) if i not in seen]
    for index in checks.spread([i for i in untried if i < lo], k) + checks.spread(
        [i for i in untried if i > hi], k
    ):
        if probe(index, 1) is not checks.expected_at(index, lo, hi, result):
            return "refused", runs
    return result.first_end, runs


def _info(p: float, false: float) -> float:
    """The most one launch tells about the culprit (bits), p and the false rate known."""

    def h(x: float) -> float:
        return 0.0 if x <= 0 or x >= 1 else -x * math.log2(x) - (1 - x) * math.log2(1 - x)

    return max(
        h(s * p + (1 - s) * false) - s * h(p) - (1 - s) * h(false)
        for s in (i / 1000 for i in range(1001))
    )


def bound(size: int, p: float, false: float, accuracy: float = 0.99) -> float:
    """Fano: the fewest mean runs any search needs for `accuracy` over N-1 culprits."""
    m, e = size - 1, 1 - accuracy
    need = math.log2(m) - (-e * math.log2(e) - (1 - e) * math.log2(1 - e)) - e * math.log2(m - 1)
    return need / _info(p, false)


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
        right, wrong, runs = 0, 0, []
        for _ in range(trials):
            culprit = rng.randrange(1, size) if change == "yes" else None
            if change == "all reproduce":
                culprit = 0
            once = _history(size, culprit, rate, false, rng)
            if method == "flaky":
                answer, cost = _flaky(size, once, rng.randrange(1 << 30))
            elif method in PLAIN:
                answer, cost = _bisect(size, once, 1, PLAIN[method], verify=True)
            else:
                answer, cost = _bisect(size, once, 3 if method == "bisect_3x" else 5)
            truth = culprit if change == "yes" else "no_change"
            right += answer == truth
            wrong += answer != truth and answer not in ("refused", "no_change")
            runs.append(cost)
        out[method] = {
            "accuracy": round(right / trials, 4),
            "wrong_found": round(wrong / trials, 4),
            "mean_runs": round(sum(runs) / trials, 1),
            "p95_runs": _p95(runs),
        }
    out["flaky_over_5x_runs"] = round(out["flaky"]["mean_runs"] / out["bisect_5x"]["mean_runs"], 2)
    out["bound"] = round(bound(size, rate, false), 1) if change == "yes" else None
    return out


def cells(sizes: list[int]) -> list[tuple[int, float, float, str]]:
    rows = [(n, p, f, "yes") for n in sizes for p in RATES for f in FALSE_RATES]
    rows += [(n, 0.0, f, "none: all clean") for n in sizes for f in FALSE_RATES]
    rows += [(n, 0.7, 0.0, "all reproduce") for n in sizes]
    return rows


def table(rows: list[dict]) -> str:
    head = "| N | p | false | change | " + " | ".join(METHODS)
    head += " | flaky / 5x runs | bound | 0.6x 5x | wrong found c1 -> c2 |"
    lines = [head, "|" + "---|" * (8 + len(METHODS))]
    for r in rows:
        figures = [
            f"{r[m]['accuracy']:.3f} ({r[m]['mean_runs']:g}, {r[m]['p95_runs']})" for m in METHODS
        ]
        p = "-" if r["change"].startswith("none") else f"{r['p']:g}"
        lines.append(
            f"| {r['n']} | {p} | {r['false']:g} | {r['change']} | "
            + " | ".join(figures)
            + f" | {r['flaky_over_5x_runs']:.2f} | {r['bound'] if r['bound'] else '-'} | "
            + f"{0.6 * r['bisect_5x']['mean_runs']:.1f} | "
            + f"{r['bisect_c1']['wrong_found']:.3f} -> {r['bisect']['wrong_found']:.3f} |"
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
