"""Where things are inside a repro's image, and the command the image runs: written once,
for the Dockerfile template, the container back end and Kubernetes pods alike. The
launcher's command line (`launcher_argv`) is written here too, pure, for the host's
launches and the image's alike. Imports only core."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reprobox.core.spec import Repro
from reprobox.core.spec_rules import refuse_nodes

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
    return launcher_argv(
        launcher, IN_IMAGE["venv"] / "bin", processes, IN_IMAGE["repro"] / repro.spec.repro.script,
        args, launcher_args=launcher_args, port=IMAGE_PORT, log_dir=OUT, rank_logs=rank_logs,
        config=IN_IMAGE["repro"] / spec.config if spec.config and preflight is None else None,
    )  # fmt: skip


def launcher_argv(
    launcher: str,
    bin_dir: Path,
    processes: int,
    script: Path,
    script_args: Sequence[str],
    *,
    launcher_args: Sequence[str] = (),
    config: Path | None = None,
    port: int = 0,
    log_dir: Path,
    rank_logs: bool = True,
    placement: Sequence[str] | None = None,
) -> list[str]:
    """The command line that starts a launch with `launcher` (torchrun, accelerate or
    python) from `bin_dir`, as a person would type it (also what the report quotes).
    `placement` is the launcher's own options for the world and this node's place in it
    (run.multinode for a launch over nodes); None is one machine of `processes` ranks."""
    command = [str(script), *script_args]
    if launcher == "torchrun":
        # Underscore spellings: the only ones torch < 2.1 understands.
        logs = ["--log_dir", str(log_dir / "torchrun"), "--tee", "3"]
        return [
            str(bin_dir / "torchrun"),
            *(placement if placement is not None else _one_machine_torchrun(processes, port)),
            *(logs if rank_logs else []),
            *launcher_args,
            *command,
        ]
    if launcher == "accelerate":
        config_file = ["--config_file", str(config)] if config else []
        # --tee prefixes each rank's lines ("[default1]:"), so launch.log splits per
        # rank; accelerate < 0.34 has no --log_dir to pass on.
        return [
            str(bin_dir / "accelerate"),
            "launch",
            *config_file,
            *(
                placement
                if placement is not None
                else ("--num_processes", str(processes), "--main_process_port", str(port))
            ),
            *(["--tee", "3"] if rank_logs else []),
            *launcher_args,
            *command,
        ]
    return [str(bin_dir / "python"), *launcher_args, *command]


def _one_machine_torchrun(processes: int, port: int) -> tuple[str, ...]:
    return (
        *("--nnodes", "1", "--nproc_per_node", str(processes)),
        *("--master_addr", "127.0.0.1", "--master_port", str(port)),
    )
