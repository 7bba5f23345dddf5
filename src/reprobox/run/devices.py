"""How many GPUs a launch needs, and how many this host has.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a 4-rank launch on a 1-GPU
host would crash on the device index; the harness says "cannot test here" (exit 125) with
the reason instead, before installing anything. A platform may allow ranks to share GPUs
(`ranks_per_gpu`, or `backend = "gloo"`, whose collectives do not care).
"""

from __future__ import annotations

import math
import shutil
import subprocess

from reprobox.core.errors import CannotTestHere
from reprobox.core.spec import Repro

CHECKED_BY = "reprobox: this host's GPU count (nvidia-smi -L), checked before installing"
# Platforms whose ranks each use a GPU (a CPU cell never needs one).
GPU_PLATFORMS = frozenset({"gpu"})


def gpu_count() -> int:
    """The GPUs `nvidia-smi -L` lists; 0 where it is absent or fails (no driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    if proc.returncode != 0:
        return 0
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))


def gpus_needed(repro: Repro, variant: str, platform: str) -> int:
    """The GPUs one launch of `variant` on `platform` needs: a rank each, or shared as the
    platform allows (`ranks_per_gpu`; over gloo one GPU serves every rank)."""
    if platform not in GPU_PLATFORMS:
        return 0
    processes = repro.launch(variant).processes
    section = repro.platform(platform)
    if section.backend == "gloo":
        return 1
    return math.ceil(processes / section.ranks_per_gpu)


def shortfall(repro: Repro, variant: str, platform: str, available: int) -> str | None:
    """Why this host cannot run the launch (too few GPUs), or None when it can."""
    needed = gpus_needed(repro, variant, platform)
    if needed <= available:
        return None
    processes = repro.launch(variant).processes
    how = f"{processes} rank{'s' if processes != 1 else ''}"
    section = repro.platform(platform)
    if section.backend != "gloo" and section.ranks_per_gpu == 1 and processes > 1:
        how += " (NCCL takes one GPU per rank)"
    return (
        f"{repro.name} {variant} on platform {platform} needs {needed} "
        f"GPU{'s' if needed != 1 else ''} for {how}; this host has {available} "
        "(nvidia-smi -L)"
    )


def require(repro: Repro, variant: str, platform: str, available: int | None = None) -> None:
    """Raise a cannot-test error (exit 125) when this host has too few GPUs for the launch;
    `available` None counts them (tests inject a count)."""
    if platform not in GPU_PLATFORMS:
        return
    count = gpu_count() if available is None else available
    problem = shortfall(repro, variant, platform, count)
    if problem is not None:
        raise CannotTestHere(f"cannot test here: {problem}", by=CHECKED_BY)
