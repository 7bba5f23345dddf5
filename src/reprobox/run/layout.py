"""Where things are inside a repro's image, and the command the image runs: written once,
for the Dockerfile template, the container back end and Kubernetes pods alike."""

from __future__ import annotations

from pathlib import Path

from reprobox.core.spec import Repro
from reprobox.run.launcher import LaunchPlan
from reprobox.run.multinode import refuse_nodes

IMAGE_USER = "10001"  # the image's non-root user (uid and gid)
IMAGE_UID = int(IMAGE_USER)
IN_IMAGE = {"venv": Path("/opt/venv"), "repro": Path("/opt/repro"), "fixes": Path("/opt/fixes")}
OUT = Path("/out")  # the result and logs of the (lead) case
CACHE = Path("/cache")  # what the script builds (a tiny model, JIT ops), kept across runs
IMAGE_PORT = 29500  # a container has its own network namespace: the default port is free
# Where an image build sees the context's wheels/ folder (a bind mount of the install step):
# wheels no index serves, and those the harness built from a git commit or a checkout.
BUILD_WHEELS = Path("/tmp/wheels")


def case_out(index: int) -> Path:
    """The folder of a batch's index-th case inside the container (`/out`, `/out1`, ...)."""
    return OUT if index == 0 else Path(f"{OUT}{index}")


def container_argv(
    repro: Repro,
    variant: str,
    script_args: list[str],
    *,
    rank_logs: bool = True,
    preflight: list[str] | None = None,
) -> list[str]:
    """The variant's launcher command as it runs inside its image. The plain python
    launcher's ranks are started by the harness on a host; inside an image torchrun starts
    them, with the same torch.distributed environment. A preflight is one plain process."""
    spec = repro.launch(variant)
    refuse_nodes(spec.nodes)  # one image runs on one machine
    launcher, launcher_args, processes = spec.launcher, list(spec.args), spec.processes
    args = list(script_args)
    if preflight is not None:
        launcher, launcher_args, processes = "python", [], 1
        args += preflight
    elif launcher == "python" and processes > 1:
        launcher, launcher_args = "torchrun", []
    plan = LaunchPlan(
        launcher=launcher,
        bin_dir=IN_IMAGE["venv"] / "bin",
        processes=processes,
        script=IN_IMAGE["repro"] / repro.spec.repro.script,
        script_args=args,
        timeout=spec.timeout,
        log_dir=OUT,
        cwd=IN_IMAGE["repro"],
        launcher_args=launcher_args,
        config=IN_IMAGE["repro"] / spec.config if spec.config and preflight is None else None,
        port=IMAGE_PORT,
        rank_logs=rank_logs,
    )
    return plan.argv()
