"""Helpers shared by the benchmarks: run a command a few times, report medians as JSON.

Benchmarks are scripts, not tests: they print figures, they do not assert timings (the
machine is shared and noisy; quote medians and ratios).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HARNESS = [sys.executable, "-m", "reprobox"]


def timed(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Wall seconds of one run; the command must succeed (0) or reproduce (1)."""
    started = time.perf_counter()
    proc = subprocess.run(list(cmd), env={**os.environ, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return wall


def summarize(walls: Sequence[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(walls), 2), "runs_s": [round(w, 2) for w in walls]}


def repeat(cmd: Sequence[str], times: int, **kwargs: Any) -> dict[str, Any]:
    return summarize([timed(cmd, **kwargs) for _ in range(times)])


def emit(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, indent=2))
