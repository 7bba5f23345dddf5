"""Pinned container images: build a variant's image from its lock, run the variant inside,
judge the result exactly as the venv path does.

The image installs the very lock the nox environment uses (images/install-lock.sh), runs as
a non-root user, and writes its result to a mounted /out. Works with podman or docker,
whichever is present and answers; a run is killed and removed at its timeout or on Ctrl-C,
so no container is left behind.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from reprobox.core import settings
from reprobox.core.cells import Cell, make_cell
from reprobox.core.errors import BadInput, EngineError, EnvError, LaunchTimeout
from reprobox.core.protocol import CACHE_ENV, RESULT_ENV
from reprobox.core.records import Record
from reprobox.core.spec import Repro
from reprobox.envs import uv
from reprobox.envs.torch_source import find_links
from reprobox.run import launcher as launch
from reprobox.run import pipeline as workflow
from reprobox.run.dockerfile import install_env_arg

IMAGE_USER = "10001"
IN_IMAGE = {"venv": Path("/opt/venv"), "repro": Path("/opt/repro"), "fixes": Path("/opt/fixes")}
OUT = Path("/out")
CACHE = Path("/cache")
BUILD_TIMEOUT_S = 3600


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
        """A host folder the image's (non-root) user can write."""
        if self.name == "podman":
            return ["-v", f"{host_dir}:{target}:U"]  # hands the folder to the image's user
        os.chown(host_dir, int(IMAGE_USER), int(IMAGE_USER))
        return ["-v", f"{host_dir}:{target}"]

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


@dataclass(frozen=True)
class ImageSpec:
    repro: Repro
    variant: str
    platform: str
    lock: Path
    dockerfile: Path
    tag: str

    @property
    def lock_sha256(self) -> str:
        return hashlib.sha256(self.lock.read_bytes()).hexdigest()


def image_spec(
    root: Path, repro: Repro, variant: str, platform: str, overrides: dict[str, str] | None = None
) -> ImageSpec:
    """The image of a variant: tagged by the hash of everything that goes into it."""
    dockerfile = root / "images" / repro.name / "Dockerfile"
    if not dockerfile.is_file():
        raise BadInput(f"{repro.name} has no image: images/{repro.name}/Dockerfile is missing")
    if variant not in repro.variants_on(platform):
        raise BadInput(f"variant {variant!r} of {repro.name} does not apply on {platform}")
    lock = workflow.lock_for(repro, variant, platform, overrides)
    digest = hashlib.sha256()
    for path in [lock, dockerfile, root / "images" / "install-lock.sh", *_tree(repro.dir),
                 *_tree(repro.fixes_dir)]:  # fmt: skip
        digest.update(str(path.name).encode() + path.read_bytes())
    tag = f"localhost/reprobox/{repro.name}:{variant}-{platform}-{digest.hexdigest()[:12]}"
    return ImageSpec(repro, variant, platform, lock, dockerfile, tag)


def _tree(directory: Path) -> list[Path]:
    return sorted(
        p for p in directory.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and "locks" not in p.parts
    )  # fmt: skip


def build(
    engine: Engine,
    spec: ImageSpec,
    *,
    base: str | None = None,
    ca_bundle: Path | None = None,
    log_dir: Path,
    no_cache: bool = False,
) -> bool:
    """Build the image unless it exists; True when built. The context holds only the lock,
    the wheels it names that no index serves, the repro, fixes/ and the installer."""
    if engine.image_exists(spec.tag) and not no_cache:
        return False
    if base and base.startswith("localhost/") and not engine.image_exists(base):
        raise EnvError(f"base image {base} not found; build it with images/base/build-base.sh")
    if ca_bundle is not None and not ca_bundle.is_file():
        raise BadInput(f"--ca-bundle {ca_bundle}: no such file")
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "build.log"
    with tempfile.TemporaryDirectory(prefix="reprobox-context-", dir=settings.cache_dir()) as tmp:
        context = _context(Path(tmp), spec)
        versions = " ".join(spec.repro.requirements(spec.variant, spec.platform))
        cmd = [engine.name, "build", "--target", spec.platform, "-f", str(spec.dockerfile),
               "-t", spec.tag, "--label", f"org.reprobox.versions={versions}"]  # fmt: skip
        args = {
            "INSTALL_ENV": install_env_arg(spec.repro, spec.platform),
            "NO_BUILD_ISOLATION": " ".join(spec.repro.spec.env.no_build_isolation),
            "LOCK_SHA256": spec.lock_sha256, "REPRO": spec.repro.name, "VARIANT": spec.variant,
            "REPRO_COMMAND": shlex.join(container_argv(spec.repro, spec.variant)),
        }  # fmt: skip
        if base:
            args["BASE" if spec.platform == "cpu" else "GPU_BASE"] = base
        for key, value in args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        if ca_bundle is not None:
            cmd += ["--secret", f"id=ca,src={ca_bundle}"]
        if no_cache:
            cmd.append("--no-cache")
        if engine.name == "podman" and base and base.startswith("localhost/"):
            cmd.append("--pull=never")  # else podman asks https://localhost/v2/ first
        cmd.append(str(context))
        started = time.monotonic()
        with log.open("w") as sink:
            sink.write(f"$ {shlex.join(cmd)}\n")
            sink.flush()
            proc = subprocess.run(
                cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S,
                env={**os.environ, **engine.build_env()},
            )  # fmt: skip
    if proc.returncode != 0:
        raise EnvError(f"image build failed: {_last_problem(log)} (log: {log})")
    label = _inspect_label(engine, spec.tag, "org.reprobox.lock-sha256")
    if label != spec.lock_sha256:
        raise EnvError(
            f"lock hash mismatch: image {spec.tag} says {label}, lock is {spec.lock_sha256}"
        )
    log.write_text(log.read_text() + f"built in {time.monotonic() - started:.1f}s\n")
    return True


def _context(directory: Path, spec: ImageSpec) -> Path:
    """Assemble the build context (see images/README.md)."""
    shutil.copy2(spec.lock, directory / "lock.txt")  # mtimes kept: buildah caches by them
    shutil.copy2(spec.dockerfile.parent.parent / "install-lock.sh", directory / "install-lock.sh")
    ignore = shutil.ignore_patterns("__pycache__", "locks")
    shutil.copytree(spec.repro.dir, directory / "repro", ignore=ignore)
    shutil.copytree(spec.repro.fixes_dir, directory / "fixes", ignore=ignore)
    (directory / "wheels").mkdir()
    (directory / "tools").mkdir()
    _link(Path(uv.uv_bin()), directory / "tools" / "uv")
    locked = spec.lock.read_text()
    for folder in find_links() if spec.platform == "cpu" else ():
        for wheel in Path(folder).glob("*.whl"):
            name, version = wheel.name.split("-")[:2]
            if f"{name.replace('_', '-')}=={version}" in locked.replace("_", "-"):
                _link(wheel, directory / "wheels" / wheel.name)
    return directory


def _link(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def container_argv(
    repro: Repro, variant: str, script_args: list[str] | None = None, *, rank_logs: bool = True
) -> list[str]:
    """The variant's launcher command as it runs inside its image (None: the variant's own
    script arguments). The plain python launcher's ranks are started by the harness on a
    host; inside an image torchrun starts them, with the same torch.distributed environment."""
    spec = repro.launch(variant)
    launcher, launcher_args = spec.launcher, spec.args
    if launcher == "python" and spec.processes > 1:
        launcher, launcher_args = "torchrun", []
    if script_args is None:
        script_args = workflow.script_args(repro, make_cell(repro, variant))
    plan = launch.LaunchPlan(
        launcher=launcher,
        bin_dir=IN_IMAGE["venv"] / "bin",
        processes=spec.processes,
        script=IN_IMAGE["repro"] / repro.spec.repro.script,
        script_args=script_args,
        timeout=spec.timeout,
        log_dir=OUT,
        cwd=IN_IMAGE["repro"],
        launcher_args=launcher_args,
        config=IN_IMAGE["repro"] / spec.config if spec.config else None,
        port=29500,
        rank_logs=rank_logs,
    )
    return plan.argv()


def run_cell(
    root: Path,
    engine: Engine,
    spec: ImageSpec,
    cell: Cell,
    options: workflow.RunOptions,
    *,
    gpus: bool = False,
) -> Record:
    """Run one cell in its image; the record is judged exactly as a venv run's."""
    repro = spec.repro
    pending = workflow.new_pending(root, repro, cell, options)
    record, run_dir = pending.record, pending.run_dir
    record.lock, record.lock_hash = str(spec.lock), spec.tag.rsplit("-", 1)[-1]
    record.runner = f"{engine.name} {spec.tag}"
    argv = container_argv(repro, cell.variant, workflow.script_args(repro, cell))
    launch_spec = repro.launch(cell.variant)
    env = {**launch_spec.env, RESULT_ENV: str(OUT / "result.json"), CACHE_ENV: str(CACHE),
           "PYTHONPATH": str(IN_IMAGE["fixes"]), "HF_HUB_OFFLINE": "1"}  # fmt: skip
    # What the script builds (a tiny model, JIT ops) outlives the container, as in a venv run.
    cache = settings.cache_dir() / "repro-cache" / f"{repro.name}-image"
    cache.mkdir(parents=True, exist_ok=True)
    name = f"reprobox-{uuid.uuid4().hex[:12]}"
    cmd = [engine.name, "run", "--rm", "--name", name, "--shm-size", "1g",
           *engine.out_mount(run_dir), *engine.out_mount(cache, CACHE)]  # fmt: skip
    for key, value in env.items():
        cmd += ["-e", f"{key}={value}"]
    cmd += [*(engine.gpu_flags() if gpus else []), spec.tag, *argv]
    record.command = cmd
    timeout = options.timeout or launch_spec.timeout
    with workflow.recording([pending]):
        started = time.monotonic()
        with (run_dir / "launch.log").open("wb") as sink:
            sink.write(f"$ {shlex.join(cmd)}\n".encode())
            sink.flush()
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                engine.remove(name)
                proc.wait()
                raise LaunchTimeout(
                    f"timed out after {timeout:g}s; container {name} killed and removed; "
                    f"logs in {run_dir}"
                ) from None
            except BaseException:
                engine.remove(name)
                proc.wait()
                raise
        outcome = launch.LaunchOutcome(
            returncode=proc.returncode,
            wall_s=time.monotonic() - started,
            timed_out=False,
            log=run_dir / "launch.log",
            rank_logs=launch.collect_rank_logs(run_dir),
        )
        record.wall_s, record.returncode = outcome.wall_s, outcome.returncode
        workflow.judge_result(repro, pending, outcome, run_dir)
    record.save()
    return record


def _inspect_label(engine: Engine, tag: str, label: str) -> str:
    proc = subprocess.run(
        [engine.name, "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}',
         tag], capture_output=True, text=True,
    )  # fmt: skip
    return proc.stdout.strip()


def _last_problem(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("install-lock:")]  # the installer's word
    if ours:
        return ours[-1]
    for line in reversed(lines):
        if any(word in line.lower() for word in ("error", "failed", "mismatch", "not known")):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def _quiet(cmd: list[str]) -> int:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1
