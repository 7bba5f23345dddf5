"""kl: one variant's wall time (median of N, warm: DeepSpeed's op and the tiny model already
built), and the one-time DeepSpeed op build, measured apart.

    .venv/bin/nox -s bench -- kl [--times 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import HARNESS, emit, summarize, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=3)
    times = parser.parse_args().times
    results = Path(tempfile.mkdtemp(prefix="bench-kl-"))
    env = {"REPROBOX_RESULTS": str(results)}
    run = [*HARNESS, "run", "kl", "--variant"]
    for variant in ("broken", "fixed"):
        timed([*run, variant], env=env)  # warm: environment, op build, model, bytecode
    figures: dict = {}
    for variant in ("broken", "fixed"):
        walls = [timed([*run, variant], env=env) for _ in range(times)]
        launches = [
            json.loads(p.read_text())["wall_s"]
            for p in sorted(results.glob(f"kl/{variant}/*/record.json"))[-times:]
        ]
        figures[variant] = {"command": summarize(walls), "launch": summarize(launches)}
    # The op build: the same run with an empty extensions folder, against the warm median.
    fresh = {**env, "TORCH_EXTENSIONS_DIR": tempfile.mkdtemp(prefix="bench-kl-ext-")}
    cold = timed([*run, "broken"], env=fresh)
    figures["deepspeed_op_build_s"] = round(cold - figures["broken"]["command"]["median_s"], 1)
    figures["broken_with_op_build_s"] = round(cold, 1)
    emit(figures)


if __name__ == "__main__":
    main()
