"""A matrix through Slurm: one array job against one job per cell. Wall time of the toy
repro's 4-cell matrix with --workers 2 both ways (the same cells, environments warm), on a
single-node cluster this script starts with scripts/slurm-cluster.sh (root) and stops.

    .venv/bin/nox -s bench -- slurm_array [--runs 3] [--workers 2]

"Separate jobs" is the Slurm back end with its array hook hidden, so the pipeline submits
one job per launch from K threads, as it did before arrays; everything else is the same.
Also counts the job ids each way (1 for the array).
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
from pathlib import Path
from typing import Any

from common import ROOT, emit

from reprobox.core import spec
from reprobox.core.cells import matrix_cells
from reprobox.core.judge import Launched
from reprobox.core.records import RecordStore
from reprobox.core.settings import Settings
from reprobox.run import pipeline
from reprobox.run.backend import LaunchRequest, Prepared
from reprobox.run.backends import slurm

CLUSTER = ROOT / "scripts" / "slurm-cluster.sh"


class OneJobEach:
    """The Slurm back end without `launch_many`: a job per launch, K threads at once."""

    name = "slurm"
    concurrent = True

    def __init__(self, inner: slurm.SlurmBackend) -> None:
        self.inner = inner

    def prepare(self, repro: spec.Repro, cell: Any, lock: Path) -> Prepared:
        return self.inner.prepare(repro, cell, lock)

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return self.inner.command(prepared, request)

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return self.inner.env_names(prepared, request)

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        return self.inner.launch(prepared, request)

    def cancel_all(self) -> None:
        self.inner.cancel_all()


def one_run(root: Path, array: bool, workers: int) -> dict[str, Any]:
    settings = Settings.from_env()
    repro = spec.load(root, "toy")
    backend = slurm.SlurmBackend(settings)
    backend.check()
    base = Path(tempfile.mkdtemp(dir=root / "results"))
    options = pipeline.RunOptions(workers=workers, results_base=base)
    store = RecordStore(settings.results)
    started = time.perf_counter()
    records = pipeline.run_cells(repro, matrix_cells(repro), backend if array else
                                 OneJobEach(backend), store, settings, options)  # fmt: skip
    wall = time.perf_counter() - started
    jobs = {json.loads(p.read_text()).get("array_job") or json.loads(p.read_text())["job"]
            for p in base.glob("**/slurm.json")}  # fmt: skip
    if pipeline.exit_code(records) != 0:
        raise SystemExit(f"the toy matrix failed: {[r.reason for r in records]}")
    return {"wall_s": wall, "job_ids": len(jobs), "verdicts": sorted(
        f"{r.label}={r.verdict}" for r in records)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="reprobox-bench-slurm-"))
    (root / "repros").mkdir()
    (root / "fixes").mkdir()
    (root / "results").mkdir()
    (root / "noxfile.py").write_text("")
    shutil.copytree(ROOT / "tests" / "fixtures" / "repros" / "toy", root / "repros" / "toy")
    shutil.copy(ROOT / "tests" / "fixtures" / "fixes" / "toy_fix.py", root / "fixes")
    os.environ.update(REPROBOX_ROOT=str(root), REPROBOX_RESULTS=str(root / "results"))
    cluster = root / "slurm"
    up = subprocess.run(["bash", str(CLUSTER), "start", str(cluster)],
                        capture_output=True, text=True)  # fmt: skip
    if up.returncode != 0:
        raise SystemExit(up.stderr)
    os.environ["SLURM_CONF"] = up.stdout.strip().splitlines()[-1].split("=", 1)[1]
    try:
        one_run(root, True, args.workers)  # warm the environments and the node
        runs: dict[str, list[dict[str, Any]]] = {"array_job": [], "separate_jobs": []}
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            runs["array_job"].append(one_run(root, True, args.workers))
            runs["separate_jobs"].append(one_run(root, False, args.workers))
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(cluster)], check=False)
    figures: dict[str, Any] = {"cells": 4, "workers": args.workers, "runs": args.runs}
    for kind, done in runs.items():
        walls = [d["wall_s"] for d in done]
        figures[kind] = {
            "median_s": round(statistics.median(walls), 2),
            "runs_s": [round(w, 2) for w in walls],
            "job_ids_per_run": sorted({d["job_ids"] for d in done}),
        }
    figures["same_verdicts"] = len({tuple(d["verdicts"]) for v in runs.values() for d in v}) == 1
    shutil.rmtree(root, ignore_errors=True)
    emit(figures)


if __name__ == "__main__":
    sys.exit(main())
