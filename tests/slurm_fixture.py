"""A real Slurm test cluster on this machine (scripts/slurm-cluster.sh: munged, slurmctld and
one slurmd per node as root, one `debug` partition), and the small readers the Slurm tests
share. Where Slurm cannot be had (not root, no slurm-wlm), a test fails and says how to
install it, unless REPROBOX_SKIP_SLURM=1 leaves it out."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from reprobox.run import launcher

CLUSTER = ROOT / "scripts" / "slurm-cluster.sh"


def free_ports(count: int) -> int:
    """A port p with p .. p+count-1 free (slurmctld, then one slurmd per node), so clusters
    never collide."""
    for _ in range(50):
        port = launcher.free_port()
        try:
            for k in range(1, count):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", port + k))
        except OSError:
            continue
        return port
    raise RuntimeError("no free run of ports")


@contextmanager
def running_cluster(where: Path, nodes: int) -> Iterator[Path]:
    """A cluster of `nodes` slurmd in `where`; SLURM_CONF points at it while it runs, and it
    is stopped by pid afterwards."""
    missing = [
        t for t in ("munged", "slurmctld", "slurmd", "sbatch", "srun") if not shutil.which(t)
    ]
    why = ""
    if missing:
        why = f"{', '.join(missing)} missing: install slurm-wlm and munge (scripts/setup-system.sh)"
    elif os.geteuid() != 0:
        why = "the test cluster's daemons run as root: run the Slurm tests as root"
    if why:
        if os.environ.get("REPROBOX_SKIP_SLURM") == "1":
            pytest.skip(f"REPROBOX_SKIP_SLURM=1: {why}")
        pytest.fail(f"{why} (or set REPROBOX_SKIP_SLURM=1 to leave the Slurm tests out)")
    env = {**os.environ, "REPROBOX_SLURM_PORT": str(free_ports(nodes + 1))}
    if nodes > 1:
        env["REPROBOX_SLURM_NODES"] = str(nodes)
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", str(where)], capture_output=True, text=True, env=env
    )
    if started.returncode != 0:
        pytest.fail(f"the {nodes}-node test cluster did not start: {started.stderr.strip()}")
    conf = started.stdout.strip().splitlines()[-1].split("=", 1)[1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", conf)
        try:
            yield where
        finally:
            subprocess.run(["bash", str(CLUSTER), "stop", str(where)], check=False)


def scontrol(*args: str) -> str:
    proc = subprocess.run(["scontrol", *args], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def queued() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("reprobox: error:")]


def wait_for(check: Callable[[], object], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def left_behind(root: Path) -> list[str]:
    """Processes whose command line names the checkout under test (runners, ranks)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(root) in line and proc.pid != os.getpid():
            found.append(f"{proc.pid} {line}")
    return found
