"""kl's signed-KL rule under the null: how often it calls a sign "systematic" when the true
mean is 0. Simulated per-sequence KLs, sd 0.05 (as measured), with a shift per (seed, rank)
batch drawn from N(0, tau^2): tau is given as a multiple of a batch mean's own standard error
(0: independent sequences). The rule is the repro's own summarize_signed; "before" is the same
with the seed batches' threshold set back to the fixed 3.0 it had.

    .venv/bin/nox -s bench -- signed_kl_null [--trials 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# kl's own modules (its common.py, not the benchmarks' one, which this script leaves out)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "repros" / "kl"))
import ppo_step0

SHAPES = ((2, 8, 512), (2, 8, 256), (1, 8, 1024), (2, 2, 512))  # ranks, seeds, per batch
TAUS = (0.0, 1.0, 3.0, 10.0)
SD = 0.05


def alarms(ranks: int, seeds: int, size: int, tau: float, trials: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    count = 0
    for _ in range(trials):
        per_rank = []
        for rank in range(ranks):
            shifts = rng.normal(0.0, tau * SD / np.sqrt(size), seeds)
            values = rng.normal(0.0, SD, (seeds, size)) + shifts[:, None]
            per_rank.append(
                {
                    "rank": rank,
                    "kl_per_sequence": values.ravel().tolist(),
                    "objective_kl_per_seed": values.mean(axis=1).tolist(),
                    "max_abs_logp_diff": 0.1,
                }
            )
        _, metrics, _, _ = ppo_step0.summarize_signed(per_rank)
        count += metrics["signed_kl_systematic"] != 0
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    started = time.perf_counter()
    current = ppo_step0.batch_critical
    rows = []
    for ranks, seeds, size in SHAPES:
        for tau in TAUS:
            row = {"ranks": ranks, "seeds": seeds, "per_batch": size, "tau_over_se": tau}
            for name, rule in (("before", lambda n: 3.0), ("after", current)):
                ppo_step0.batch_critical = rule
                hits = alarms(ranks, seeds, size, tau, args.trials, seed=int(tau * 10) + size)
                row[f"false_alarm_{name}"] = round(hits / args.trials, 4)
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    ppo_step0.batch_critical = current
    print(
        json.dumps(
            {
                "trials": args.trials,
                "wall_s": round(time.perf_counter() - started, 1),
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
