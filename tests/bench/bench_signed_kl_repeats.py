"""kl's signed-KL conclusion through the statistical verdict: its false-alarm rate under the
null and whether ten independent runs at the same n agree.

Simulated (the default): each launch's per-sequence KLs as in bench_signed_kl_null.py (sd
0.05, a shift per (seed, rank) batch of tau x a batch mean's standard error), summarised by
the repro's own `summarize_signed`, judged launch by launch as the harness does, and the
launches turned into the cell's conclusion by the harness's own `core.repeat_verdict.aggregate`
with the [verdict] of repro.toml's `signed_kl` (its repeats, test, alpha, effect). Reported per
true mean and tau: how often a run concludes reproduced / clean / undecided, the false-alarm
rate (reproduced when the true mean is not negative), and the share of groups of ten
independent runs whose commonest conclusion holds in >= 9 of them.

    .venv/bin/nox -s bench -- signed_kl_repeats [--runs 400] [--real 10]

`--real N` instead runs the real variant N times through the CLI (`reprobox run kl --variant
signed_kl`, each run its 6 launches: about 6 minutes a run on 2 quiet CPU cores) and prints
each run's conclusion and the agreement.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from reprobox.core import repeat_verdict, spec
from reprobox.core.errors import ExitCode
from reprobox.core.judge import Judgement, Status
from reprobox.core.protocol import Expectation, Verdict

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "repros" / "kl"))
import ppo_step0  # noqa: E402

SD = 0.05
RANKS, SEEDS, PER_BATCH = 2, 8, 512  # signed_kl's shape: 2 ranks x 8 seeds x 512
MEANS = (0.0, 0.00026, -0.002, -0.004)  # 0.00026: the variant's measured pooled mean on CPU
TAUS = (0.0, 3.0, 10.0)


def _launch(rng: np.random.Generator, mean: float, tau: float) -> Judgement:
    per_rank = []
    for rank in range(RANKS):
        shifts = rng.normal(0.0, tau * SD / np.sqrt(PER_BATCH), SEEDS)
        values = mean + rng.normal(0.0, SD, (SEEDS, PER_BATCH)) + shifts[:, None]
        per_rank.append(
            {
                "rank": rank,
                "kl_per_sequence": values.ravel().tolist(),
                "objective_kl_per_seed": values.mean(axis=1).tolist(),
                "max_abs_logp_diff": 0.1,
            }
        )
    verdict, metrics, reason, _ = ppo_step0.summarize_signed(per_rank)
    return Judgement(Verdict(verdict), Status.RECORDED, reason, ExitCode.OK, metrics=metrics)


def _conclude(
    section: spec.VerdictSection, rng: np.random.Generator, mean: float, tau: float
) -> str:
    """One run of the cell as the repeat loop runs it: launch to the next look, read."""
    judged: list[Judgement] = []
    while True:
        while len(judged) < repeat_verdict.next_look(section, len(judged)):
            judged.append(_launch(rng, mean, tau))
        samples = [{"repeat": i} for i in range(len(judged))]
        out = repeat_verdict.aggregate(section, Expectation.UNKNOWN, [], judged, samples)
        if repeat_verdict.decided(out) or len(judged) >= repeat_verdict.most(section):
            return out.verdict.value if out.verdict else "undecided"


CONCLUSIONS = ("reproduced", "clean", "undecided")


def _agreement(
    counts: collections.Counter[str], runs: int, groups: int, seed: int
) -> tuple[float, float]:
    """Over groups of ten runs (drawn from the measured conclusions' frequencies): the share
    whose commonest conclusion holds in >= 9 (strict), and the share where >= 9 reach one
    conclusion or undecided (no more than one run says the opposite of the others)."""
    rng = np.random.default_rng(seed)
    p = np.array([counts[c] for c in CONCLUSIONS], dtype=float) / runs
    draws = rng.multinomial(10, p, size=groups)
    strict = float((draws.max(axis=1) >= 9).mean())
    reproduced, clean, undecided = draws[:, 0], draws[:, 1], draws[:, 2]
    either = np.maximum(reproduced, clean) + undecided
    return strict, float((either >= 9).mean())


def simulated(runs: int) -> dict:
    section = spec.load(ROOT, "kl").verdict("signed_kl")
    rows = []
    for mean in MEANS:
        for tau in TAUS:
            rng = np.random.default_rng(int(1e6 * abs(mean)) * 100 + int(tau * 10))
            counts = collections.Counter(_conclude(section, rng, mean, tau) for _ in range(runs))
            row = {
                "true_mean": mean,
                "tau_over_se": tau,
                **{k: round(counts[k] / runs, 4) for k in CONCLUSIONS},
                "false_alarm": round(counts["reproduced"] / runs, 4) if mean >= 0 else None,
                **dict(
                    zip(
                        ("ten_agree_strict", "ten_agree_or_undecided"),
                        (round(v, 4) for v in _agreement(counts, runs, 20000, 1)),
                        strict=True,
                    )
                ),
            }
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    return {"section": section.model_dump(), "runs": runs, "rows": rows}


def real(times: int) -> dict:
    conclusions = []
    for _ in range(times):
        done = subprocess.run(
            [sys.executable, "-m", "reprobox", "run", "kl", "--variant", "signed_kl"],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        records = sorted((ROOT / "results" / "kl" / "cpu-signed_kl").glob("*/record.json"))
        record = json.loads(records[-1].read_text())
        conclusion = record["verdict"] or record["status"]
        conclusions.append(
            {"exit": done.returncode, "conclusion": conclusion, "stat": record["stat"]}
        )
        print(conclusions[-1], file=sys.stderr, flush=True)
    counts = collections.Counter(c["conclusion"] for c in conclusions)
    return {"runs": conclusions, "commonest": counts.most_common(1)[0], "of": times}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--real", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    out = real(args.real) if args.real else simulated(args.runs)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
