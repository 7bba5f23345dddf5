"""The container engine (podman or docker): its command-line differences in one place, and
the first engine that is installed and answers. A run is confined: no capabilities, no
privilege gain, a read-only root (it writes only /out, /cache and a /tmp in memory),
bounded processes and memory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from reprobox.core.errors import EngineError
from reprobox.run.layout import OUT

SHM_GIB = 1  # /dev/shm of a run: NCCL, gloo and dataloaders need more than the 64 MiB default
PIDS_LIMIT = 4096  # processes and threads of one run (torch starts many threads per rank)


@dataclass(frozen=True)
class Engine:
    """The container engine's command-line differences, in one place."""

    name: str  # podman | docker

    def image_exists(self, tag: str) -> bool:
        args = ["image", "exists", tag] if self.name == "podman" else ["image", "inspect", tag]
        return _quiet([self.name, *args]) == 0

    def build_env(self) -> dict[str, str]:
        return {"DOCKER_BUILDKIT": "1"} if self.name == "docker" else {}  # RUN --mount, secrets

    def out_mount(self, host_dir: Path, target: Path = OUT) -> list[str]:
        """A host folder the container may write, without handing it to the image's user
        (no chown: a CI checkout must stay deletable by the runner). A non-root host user
        runs the container as itself (`user_flags`); as root the folder is opened to the
        image's user by its mode alone."""
        if os.geteuid() == 0:
            host_dir.chmod(host_dir.stat().st_mode | 0o777)
        return ["-v", f"{host_dir}:{target}"]

    def user_flags(self) -> list[str]:
        """Run as the host user where that user is not root, so what the container writes
        is the host user's (rootless podman maps the user in with keep-id)."""
        if os.geteuid() == 0:
            return []
        user = ["--user", f"{os.geteuid()}:{os.getegid()}"]
        return ["--userns=keep-id", *user] if self.name == "podman" else user

    def confine_flags(self, memory: str) -> list[str]:
        """What a run may not do: gain capabilities or privileges (setuid binaries), write
        its image, start unbounded processes or use unbounded memory."""
        tmp = [] if self.name == "podman" else ["--tmpfs", "/tmp"]  # podman mounts one itself
        return ["--cap-drop=ALL", "--security-opt=no-new-privileges", "--read-only", *tmp,
                f"--pids-limit={PIDS_LIMIT}", f"--memory={memory}",
                f"--shm-size={SHM_GIB}g"]  # fmt: skip

    def gpu_flags(self) -> list[str]:
        return ["--gpus", "all"] if self.name == "docker" else ["--device", "nvidia.com/gpu=all"]

    def remove(self, container: str) -> None:
        """Kill and remove a container; quiet when it is already gone."""
        _quiet([self.name, "kill", container])
        force = ["rm", "-f", "-t", "0", "--ignore"] if self.name == "podman" else ["rm", "-f"]
        _quiet([self.name, *force, container])


def find_engine(preferred: str | None = None) -> Engine:
    """The first engine that is installed and answers, else a plain error saying why."""
    problems = []
    for name in [preferred] if preferred else ["podman", "docker"]:
        if shutil.which(name) is None:
            continue
        proc = subprocess.run([name, "info"], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            return Engine(name)
        said = (proc.stderr or proc.stdout).strip().splitlines()
        problems.append(f"{name} does not work: {said[-1] if said else f'exit {proc.returncode}'}")
    if problems:
        raise EngineError("; ".join(problems))
    wanted = preferred or "podman or docker"
    raise EngineError(
        f"no container engine found ({wanted}); on Debian: sudo bash images/setup-podman.sh"
    )


def _quiet(cmd: list[str]) -> int:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1
