"""A metric test's repeated launches on simulated samples: how often each declared test
decides, decides wrong, or stays undecided, and how many launches it took. Samples are
normal: "clean" at mean = threshold (0), "reproduced" at threshold + effect (0.5).
The loop is the pipeline's (run/repeat_loop.py): launch to the next look, judge with
core.repeat_verdict, stop once decided.

    .venv/bin/nox -s bench -- metric_repeats [--trials 400]

Rows: repros/README.md's example as it was (repeats = 20), as it is now ("auto", default
budget), and "auto" on a metric twice as noisy (sd 2: the budget cannot tell 0.5 there, so
the power calculation stops it early, undecided; wrong never).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from reprobox.core import repeat_verdict
from reprobox.core.judge import Judgement, Status
from reprobox.core.protocol import Expectation, Verdict
from reprobox.core.spec import Rule, VerdictSection

RULE = [Rule(metric="gap", above=0.0)]
EXAMPLE = {"test": "t", "metric": "gap", "threshold": 0.0, "effect": 0.5, "alpha": 0.01}
ROWS: list[tuple[str, dict[str, Any], float]] = [  # name, declared, the samples' sd
    ("repeats = 20 (the example before)", {"repeats": 20}, 1.0),
    ('repeats = "auto" (the example now)', {"repeats": "auto"}, 1.0),
    ('repeats = "auto", sd 2', {"repeats": "auto"}, 2.0),
]


def run_cell(
    section: VerdictSection, mean: float, sd: float, rng: random.Random
) -> tuple[str, int]:
    """One cell's repeated launches: its decision and how many launches it took."""
    judged: list[Judgement] = []
    while True:
        stop = repeat_verdict.next_look(section, len(judged))
        while len(judged) < stop:
            value = rng.gauss(mean, sd)
            verdict = Verdict.REPRODUCED if value > 0 else Verdict.CLEAN
            judged.append(Judgement(verdict, Status.MATCH, "", 0, metrics={"gap": value}))
        samples: list[dict[str, Any]] = [{} for _ in judged]
        out = repeat_verdict.aggregate(section, Expectation.UNKNOWN, [], judged, samples)
        if repeat_verdict.decided(out) or len(judged) >= repeat_verdict.most(section):
            return (out.verdict.value if out.verdict else "undecided"), len(judged)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=400)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for name, extra, sd in ROWS:
        section = VerdictSection(reproduced_if=RULE, **{**EXAMPLE, **extra})
        for truth, mean in (("clean", 0.0), ("reproduced", 0.5)):
            rng = random.Random(f"{name}/{truth}")
            found = [run_cell(section, mean, sd, rng) for _ in range(args.trials)]
            decisions = [d for d, _ in found]
            wrong = "reproduced" if truth == "clean" else "clean"
            row = {
                "declared": name,
                "truth": f"{truth} (mean {mean:g}, sd {sd:g})",
                "right": round(decisions.count(truth) / args.trials, 3),
                "wrong": round(decisions.count(wrong) / args.trials, 3),
                "undecided": round(decisions.count("undecided") / args.trials, 3),
                "mean_launches": round(statistics.fmean(n for _, n in found), 1),
                "max_launches": max(n for _, n in found),
            }
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    wall = round(time.perf_counter() - started, 1)
    print(json.dumps({"trials": args.trials, "wall_s": wall, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
