"""Parallel probes: rounds and probes of a K-worker multisection against ceil(log_{K+1} N)+2,
wall time of a real bisect with 2 workers against 1, and the same bisect through Slurm (its
answer, and Slurm's overhead per probe: submit to start, end to result read).

    .venv/bin/nox -s bench -- parallel [--real] [--slurm]

Rounds come from a simulated clock (every probe takes one unit: a round is one unit), over
every boundary position of N = 8, 32, 128 items; then through `release_bisect` itself (the
toy repro, a fake numpy index of N releases, probes that sleep), where rounds are wall time
over one probe's time. `--real` bisects the toy repro's gate variant over real numpy
releases with --workers 1 and 2 (warm environments: run it once first); `--slurm` adds a
2-worker bisect through a single-node cluster started by scripts/slurm-cluster.sh (root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import HARNESS, ROOT, emit

sys.path.insert(0, str(ROOT / "tests"))

from bisect_fakes import FakeIndex
from multisect_fakes import SimulatedRunner, history
from packaging.version import Version

from reprobox.bisect import releases
from reprobox.bisect.prober import Outcome, Probes, Target
from reprobox.bisect.search import multisect, rounds_bound
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import summary_file
from reprobox.core import spec
from reprobox.core.protocol import Verdict
from reprobox.core.settings import Settings
from reprobox.envs.index import Release
from reprobox.run import pipeline

SIZES = (8, 32, 128)
WORKERS = (1, 2, 4)


def simulated() -> list[dict]:
    rows = []
    for n in SIZES:
        for k in WORKERS:
            rounds, probes, confirmed = [], [], []
            for first in range(1, n):
                probe, calls = history(first)
                runner = SimulatedRunner(probe, k)
                multisect(list(range(n)), probe, workers=k, confirm=0, runner=runner)
                rounds.append(runner.now)
                probes.append(len(calls))
                probe, _ = history(first)
                runner = SimulatedRunner(probe, k)
                multisect(list(range(n)), probe, workers=k, confirm=1, runner=runner)
                confirmed.append(runner.now)
            rows.append({
                "N": n, "K": k, "bound": rounds_bound(n, k),
                "rounds_mean": round(statistics.mean(rounds), 2), "rounds_max": max(rounds),
                "probes_mean": round(statistics.mean(probes), 2), "probes_max": max(probes),
                "rounds_with_confirm_max": max(confirmed),
            })  # fmt: skip
    return rows


def through_release_bisect(probe_s: float = 0.05) -> list[dict]:
    """The whole release bisect (ends checked at once, the search, --verify) on fake runs."""
    rows = []
    scratch = _toy_root()
    settings = Settings.from_env({"REPROBOX_ROOT": str(scratch),
                                  "REPROBOX_RESULTS": str(scratch / "results")})  # fmt: skip
    repro = spec.load(scratch, "toy")
    target = Target(repro, "gate", pipeline.RunOptions(platform="cpu"), settings)
    for n in SIZES:
        versions = [f"1.{minor}.0" for minor in range(n)]
        base = datetime(2020, 1, 1, tzinfo=UTC)
        index = FakeIndex({"numpy": [Release(Version(v), uploaded=base) for v in versions]})
        flip = versions[(2 * n) // 3]
        for k in WORKERS:

            def run(item: str, attempt: int, flip: str = flip) -> Outcome:
                time.sleep(probe_s)
                reproduced = Version(item) >= Version(flip)
                return Outcome("verdict", Verdict.REPRODUCED if reproduced else Verdict.CLEAN,
                               wall_s=probe_s)  # fmt: skip

            probes = Probes(run=run, env_key=lambda item: f"env-{item}")
            started = time.perf_counter()
            summary = releases.release_bisect(
                target, "numpy", versions[0], versions[-1], index,
                strategy=Strategy(confirm=1, workers=k),
                log_path=scratch / f"n{n}" / f"k{k}" / "probes.jsonl", probes=probes,
            )  # fmt: skip
            wall = time.perf_counter() - started
            rows.append({
                "N": n, "K": k, "first": summary.first, "status": summary.status,
                "runs": summary.runs, "verify_probes": len(summary.verified),
                "rounds_by_wall": round(wall / probe_s, 1), "bound": rounds_bound(n, k),
            })  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _toy_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="bench-parallel-toy-"))
    (root / "repros").mkdir()
    (root / "fixes").mkdir()
    shutil.copytree(ROOT / "tests" / "fixtures" / "repros" / "toy", root / "repros" / "toy")
    shutil.copy(ROOT / "tests" / "fixtures" / "fixes" / "toy_fix.py", root / "fixes")
    (root / "noxfile.py").write_text("")
    return root


def real_bisect(root: Path, *extra: str) -> dict:
    log = root / f"log{'-'.join(extra)}.jsonl"
    env = {**os.environ, "REPROBOX_ROOT": str(root), "REPROBOX_RESULTS": str(root / "results")}
    started = time.perf_counter()
    done = subprocess.run([*HARNESS, "bisect", "toy", "--log", str(log), *extra],
                          capture_output=True, text=True, env=env)  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bisect {' '.join(extra)} failed: {done.stderr[-2000:]}")
    summary = json.loads(summary_file(log).read_text())  # each log has its own
    figures = {"args": " ".join(extra) or "--workers 1", "answer": summary["first"],
               "status": summary["status"], "launched": summary["launched"],
               "wall_s": round(wall, 1),
               "probe_wall_s_median": round(statistics.median(
                   p["wall_s"] for p in summary["probes"] if p["wall_s"]), 1)}  # fmt: skip
    jobs = [json.loads(p.read_text()) for p in log.parent.glob("runs/**/slurm.json")]
    if jobs:
        starts = [j["started_at"] - j["submitted_at"] for j in jobs if j.get("started_at")]
        reads = [j["read_at"] - j["ended_at"] for j in jobs if j.get("ended_at")]
        figures["slurm_jobs"] = len(jobs)
        figures["submit_to_start_s_median"] = round(statistics.median(starts), 2)
        figures["submit_to_start_s_max"] = round(max(starts), 2)
        figures["end_to_read_s_median"] = round(statistics.median(reads), 2)
        figures["end_to_read_s_max"] = round(max(reads), 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--real", action="store_true", help="also bisect the toy repro for real")
    parser.add_argument("--slurm", action="store_true", help="and through a Slurm test cluster")
    args = parser.parse_args()
    figures: dict = {"simulated": simulated(), "release_bisect_fake_runs": through_release_bisect()}
    if args.real or args.slurm:
        root = _toy_root()
        real = [real_bisect(root), real_bisect(root, "--workers", "2")]
        if args.slurm:
            cluster = root / "slurm"
            up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-cluster.sh"), "start",
                                 str(cluster)], capture_output=True, text=True)  # fmt: skip
            if up.returncode != 0:
                raise SystemExit(up.stderr)
            os.environ["SLURM_CONF"] = up.stdout.strip().splitlines()[-1].split("=", 1)[1]
            try:
                real.append(real_bisect(root, "--workers", "2", "--backend", "slurm"))
            finally:
                subprocess.run(["bash", str(ROOT / "scripts" / "slurm-cluster.sh"), "stop",
                                str(cluster)], check=False)  # fmt: skip
        figures["toy_gate_bisect"] = real
        figures["same_answer"] = len({r["answer"] for r in real}) == 1
        shutil.rmtree(root, ignore_errors=True)
    emit(figures)


if __name__ == "__main__":
    main()
