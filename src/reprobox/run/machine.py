"""What the machine under a run says about itself, for the record: the facts GPU threads stall
on when nobody wrote them down. The same environment hangs on kernel 5.4 and not on 5.15
(accelerate#1929, #3708); NCCL settings decide P2P hangs; a small /dev/shm breaks DataLoader
workers; bf16 results differ between CPUs (kl's step-0 figures moved from 0.0813 to 0.0692
between two machines of one kind). So every record keeps:

kernel, cpu (model), cpu_flags (of the flags that change numerics or kernels, those present),
dev_shm (its size, where the launch ran: a container's is its --shm-size), gpu (count and
model) and driver (from nvidia-smi, where there is one), cuda_runtime and nccl (the versions
the lock pins: torch's wheels bring them as nvidia-* packages), image (a container's digest),
and each NCCL_*, CUDA_* and TORCH_* variable the launch gets, as `env NAME` (values scrubbed
of secrets; names that look like credentials never reach a launch).

Reading it costs a few file reads and, on a host with nvidia-smi, one call of it, made once a
process.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from reprobox.core.scrub import secrets_out

VARIABLE_PREFIXES = ("NCCL_", "CUDA_", "TORCH_")
# Flags that decide which kernels (and so which bf16/fp16 roundings) torch and oneDNN use.
CPU_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_bf16", "avx512_fp16",
    "avx512_vnni", "amx_bf16", "amx_fp16", "amx_int8", "amx_tile", "asimd", "sve", "sve2",
)  # fmt: skip
# The lock's pins that name what torch's CUDA wheels bring (nvidia-nccl-cu12==2.21.5, ...).
_RUNTIME = re.compile(r"^nvidia-cuda-runtime-cu\d+$")
_NCCL = re.compile(r"^nvidia-nccl-cu\d+$")
SMI_TIMEOUT_S = 10.0


def capture(
    variables: Mapping[str, str],
    lock_text: str = "",
    *,
    proc: Path = Path("/proc"),
    shm: Path = Path("/dev/shm"),
) -> dict[str, str]:
    """The facts of this machine for one launch: the variables the launch gets (their
    NCCL_*, CUDA_* and TORCH_* kept), and the versions `lock_text` pins. `proc` and `shm` are
    where to read the rest (tests hand in folders of their own)."""
    found = {**_host(proc, shm), **_gpus()}
    found.update(pinned_runtime(lock_text))
    for name in sorted(variables):
        if name.startswith(VARIABLE_PREFIXES):
            found[f"env {name}"] = str(secrets_out(variables[name]))
    return found


def launch_variables(
    names: Iterable[str], environ: Mapping[str, str], launch_env: Mapping[str, str]
) -> dict[str, str]:
    """The values of the variables a launch starts with (`names`, as its back end says):
    [launch] env first, else the harness's own."""
    return {
        name: launch_env[name] if name in launch_env else environ[name]
        for name in names
        if name in launch_env or name in environ
    }


@functools.lru_cache(maxsize=4)
def _host(proc: Path, shm: Path) -> dict[str, str]:
    found = {"kernel": _kernel(proc)}
    model, flags = _cpu(proc)
    if model:
        found["cpu"] = model
    if flags:
        found["cpu_flags"] = " ".join(flag for flag in CPU_FLAGS if flag in flags)
    size = shm_size(shm)
    if size is not None:
        found["dev_shm"] = size_text(size)
    return found


def _kernel(proc: Path) -> str:
    try:
        return (proc / "sys" / "kernel" / "osrelease").read_text().strip()
    except OSError:
        return os.uname().release


def _cpu(proc: Path) -> tuple[str, set[str]]:
    """The CPU's model name and flags, from cpuinfo (x86 `flags`, arm `Features`)."""
    try:
        text = (proc / "cpuinfo").read_text(errors="replace")
    except OSError:
        return "", set()
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = " ".join(value.split())
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


def shm_size(shm: Path) -> int | None:
    """/dev/shm's size in bytes (None where there is none)."""
    try:
        stat = os.statvfs(shm)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def size_text(size: int) -> str:
    gib = size / 1024**3
    return f"{gib:.1f} GiB" if gib >= 1 else f"{size / 1024**2:.0f} MiB"


@functools.lru_cache(maxsize=1)
def _gpus() -> dict[str, str]:
    """The GPUs nvidia-smi lists (count and model) and the driver; nothing without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=SMI_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {"gpu": "nvidia-smi did not answer"}
    return gpu_facts(done.stdout if done.returncode == 0 else "")


def gpu_facts(csv: str) -> dict[str, str]:
    """`nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` as the record
    keeps it: `gpu` = "N x MODEL" (models joined by " + " where they differ), `driver`."""
    rows = [[part.strip() for part in line.split(",")] for line in csv.splitlines() if line]
    rows = [row for row in rows if len(row) >= 2 and row[0]]
    if not rows:
        return {}
    models: dict[str, int] = {}
    for name, _ in rows:
        models[name] = models.get(name, 0) + 1
    return {
        "gpu": " + ".join(f"{count} x {name}" for name, count in models.items()),
        "driver": ", ".join(dict.fromkeys(row[1] for row in rows)),
    }


def pinned_runtime(lock_text: str) -> dict[str, str]:
    """The CUDA runtime and NCCL versions a lock pins (torch's CUDA wheels bring them as
    nvidia-* packages); nothing for a CPU lock."""
    found = {}
    for line in lock_text.splitlines():
        name, sep, rest = line.partition("==")
        if not sep or line[:1] in " #-":
            continue
        version = rest.split()[0].rstrip("\\").split(";")[0] if rest.split() else ""
        canonical = canonicalize_name(name.strip())
        if _RUNTIME.match(canonical):
            found["cuda_runtime"] = version
        elif _NCCL.match(canonical):
            found["nccl"] = version
    return found
