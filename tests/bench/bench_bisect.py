"""Bisection figures: probes against ceil(log2 N) + 2, a warm bisect's wall time against the
sum of its probes, and environment creation (uv vs pip, cold vs warm) for a lock.

    .venv/bin/nox -s bench -- bisect [--repro shuffle_seed] [--env-repro kl --env-variant broken]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import HARNESS, ROOT, emit

from reprobox.core import spec
from reprobox.core.settings import Settings
from reprobox.envs import torch_source, uv
from reprobox.run import pipeline as workflow


def bisect_run(repro: str, log: Path) -> dict:
    proc = subprocess.run([*HARNESS, "bisect", repro, "--log", str(log)],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"bisect failed: {proc.stderr}")
    summary = json.loads(log.with_name("summary.json").read_text())
    keep = ("result", "items", "bound", "distinct_probed", "skips", "runs", "launched",
            "wall_s", "probe_wall_s")  # fmt: skip
    figures = {k: summary[k] for k in keep}
    figures["within_bound"] = summary["distinct_probed"] <= summary["bound"] + summary["skips"]
    figures["wall_over_probes"] = round(summary["wall_s"] / max(summary["probe_wall_s"], 1e-9), 3)
    return figures


def env_creation(repro_name: str, variant: str) -> dict:
    repro = spec.load(ROOT, repro_name)
    lock = workflow.lock_for(repro, variant, settings=Settings.from_env())
    scratch = Path(tempfile.mkdtemp(prefix="bench-env-"))
    uv_path = uv.uv_bin()
    links = [
        arg
        for link in torch_source.find_links(Settings.from_env())
        for arg in ("--find-links", link)
    ]
    install_env = {**os.environ, **repro.install_env()}
    figures = {"lock": str(lock.relative_to(ROOT)) if lock.is_relative_to(ROOT) else str(lock)}

    def time_it(name: str, cmds: list[list[str]], env: dict[str, str]) -> None:
        venv = scratch / name
        started = time.perf_counter()
        for cmd in cmds:
            subprocess.run([c.replace("{venv}", str(venv)) for c in cmd], check=True, env=env,
                           capture_output=True)  # fmt: skip
        figures[name] = round(time.perf_counter() - started, 1)
        shutil.rmtree(venv, ignore_errors=True)

    uv_cmds = [[uv_path, "venv", "-q", "{venv}"],
               [uv_path, "pip", "sync", "-q", "--require-hashes", "--python", "{venv}/bin/python",
                *links, str(lock)]]  # fmt: skip
    pip_cmds = [["python3", "-m", "venv", "{venv}"],
                ["{venv}/bin/pip", "install", "-q", "--no-deps", "--require-hashes", "-r",
                 str(lock)]]  # fmt: skip
    cold_uv = {**install_env, "UV_CACHE_DIR": str(scratch / "uv-cache")}
    cold_pip = {**install_env, "PIP_CACHE_DIR": str(scratch / "pip-cache")}
    time_it("uv_cold_s", uv_cmds, cold_uv)  # empty cache: downloads everything
    time_it("uv_warm_s", uv_cmds, cold_uv)  # the cache the cold run filled
    time_it("pip_cold_s", pip_cmds, cold_pip)
    time_it("pip_warm_s", pip_cmds, cold_pip)
    shutil.rmtree(scratch, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repro", default="shuffle_seed")
    parser.add_argument("--env-repro", default="kl")
    parser.add_argument("--env-variant", default="broken")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    first = bisect_run(args.repro, logs / "first" / "probes.jsonl")  # fills the env cache
    warm = bisect_run(args.repro, logs / "warm" / "probes.jsonl")  # fresh log, warm caches
    emit({"first_bisect": first, "warm_bisect": warm,
          "env_creation": env_creation(args.env_repro, args.env_variant)})  # fmt: skip


if __name__ == "__main__":
    main()
