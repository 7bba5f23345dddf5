"""Pinned container images: build a variant's image from its lock, run the variant inside,
judge the result exactly as the venv path does.

The image installs the very lock the nox environment uses (images/install-lock.sh), runs as
a non-root user, and writes its result to a mounted /out. Works with podman or docker,
whichever is present and answers; a run is killed and removed at its timeout or on Ctrl-C,
so no container is left behind. A run is confined: no capabilities, no privilege gain, a
read-only root (it writes only /out, /cache and a /tmp in memory), bounded processes and
memory. `push` sends a built image to a registry and records the digest it got
(run/pushes.py), which `reprobox k8s` names instead of a tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from reprobox.core.cells import Cell, make_cell, script_args
from reprobox.core.errors import BadInput, EngineError, EnvError, ExitCode
from reprobox.core.files import atomic_write
from reprobox.core.judge import Launched
from reprobox.core.protocol import CACHE_ENV, PLAN_ENV, RESULT_ENV
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.envs import uv, venvs
from reprobox.envs.torch_source import find_links
from reprobox.run import pushes, watchdog
from reprobox.run.backend import PLAN_FILE, RESULT_FILE, LaunchRequest, Prepared
from reprobox.run.dockerfile import install_env_arg
from reprobox.run.exits import last_error, launcher_exits
from reprobox.run.layout import BUILD_WHEELS, CACHE, IN_IMAGE, OUT, case_out, container_argv
from reprobox.run.logs import collect_rank_logs
from reprobox.run.pipeline import plan_text, resolve_sources

BUILD_TIMEOUT_S = 3600
PUSH_TIMEOUT_S = 3600
SHM_GIB = 1  # /dev/shm of a run: NCCL, gloo and dataloaders need more than the 64 MiB default
MEMORY_PER_PROCESS_GIB = 4  # a run's memory bound by default: per rank, plus /dev/shm
PIDS_LIMIT = 4096  # processes and threads of one run (torch starts many threads per rank)
COMMITS_LABEL = "org.reprobox.commits"  # `name=sha ...`: the commits of built wheels


def default_memory(processes: int) -> str:
    """The memory bound of a run with `processes` ranks (`--memory` overrides it)."""
    return f"{MEMORY_PER_PROCESS_GIB * processes + SHM_GIB}g"


def check_memory(text: str) -> str:
    """`--memory` as both engines take it (a number with b, k, m or g), or a plain error."""
    if not re.fullmatch(r"[1-9][0-9]*[bkmg]?", text.strip().lower()):
        raise BadInput(f"--memory {text!r}: want a size such as 16g or 512m")
    return text.strip().lower()


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


@dataclass(frozen=True)
class ImageSpec:
    repro: Repro
    variant: str
    platform: str
    lock: Path  # what the image installs (`image_lock`: built wheels at their in-build path)
    dockerfile: Path
    tag: str
    wheels: tuple[Path, ...] = ()  # wheels the harness built (git commits, checkouts)
    commits: tuple[tuple[str, str], ...] = ()  # (package, the commit its wheel holds)

    @property
    def lock_sha256(self) -> str:
        return hashlib.sha256(self.lock.read_bytes()).hexdigest()


def image_spec(
    root: Path,
    repro: Repro,
    variant: str,
    platform: str,
    lock: Path,
    commits: Mapping[str, str] | None = None,
) -> ImageSpec:
    """The image of a variant at `lock`: tagged by the hash of everything that goes in. A
    lock naming wheels the harness built (`--with NAME@git+URL@REF`, `--with-editable`) is
    installed as `image_lock` rewrites it, those wheels copied into the build context, so
    the image holds exactly those commits (`commits`, in its tag and labels)."""
    dockerfile = root / "images" / repro.name / "Dockerfile"
    if not dockerfile.is_file():
        raise BadInput(f"{repro.name} has no image: images/{repro.name}/Dockerfile is missing")
    if variant not in repro.variants_on(platform):
        raise BadInput(f"variant {variant!r} of {repro.name} does not apply on {platform}")
    lock, wheels = image_lock(lock)
    ran = tuple(sorted((commits or {}).items()))
    digest = hashlib.sha256()
    for path in [lock, dockerfile, root / "images" / "install-lock.sh", *_tree(repro.dir),
                 *_tree(repro.fixes_dir)]:  # fmt: skip
        digest.update(str(path.name).encode() + path.read_bytes())
    if ran:  # (absent otherwise: the tags of every other image stay as they were)
        digest.update(json.dumps(ran).encode())
    tag = f"localhost/reprobox/{repro.name}:{variant}-{platform}-{digest.hexdigest()[:12]}"
    return ImageSpec(repro, variant, platform, lock, dockerfile, tag, wheels, ran)


def image_lock(lock: Path) -> tuple[Path, tuple[Path, ...]]:
    """(the lock an image installs, the host wheels it needs in the build context).

    A lock entry `name @ file:///<cache>/...whl` names a wheel the container cannot see; the
    image's lock names it at BUILD_WHEELS (the context's wheels/ folder), hash unchanged, so
    the install checks the very bytes built here. A lock without one is used as it is; the
    rewritten one is kept beside it (written only when it changes: builders cache by
    mtime)."""
    text = lock.read_text()
    wheels: list[Path] = []
    rewritten = text
    for url in dict.fromkeys(filter(None, map(_wheel_url, text.splitlines()))):
        wheel = Path(unquote(urlparse(url).path))
        if not wheel.is_file():
            raise EnvError(f"{lock}: the wheel it names is gone ({wheel}); run it again")
        wheels.append(wheel)
        rewritten = rewritten.replace(url, (BUILD_WHEELS / wheel.name).as_uri())  # comments too
    if not wheels:
        return lock, ()
    dest = lock.with_name(lock.stem + ".image.txt")
    if not dest.is_file() or dest.read_text() != rewritten:
        atomic_write(dest, rewritten)
    return dest, tuple(wheels)


def _wheel_url(line: str) -> str | None:
    """The `file://` wheel URL a lock entry names, if it names one."""
    if not line.strip() or line[0] in " #-":
        return None
    try:
        requirement = Requirement(line.strip().rstrip("\\").strip())
    except InvalidRequirement:
        return None
    url = requirement.url or ""
    return url if url.startswith("file://") and url.endswith(".whl") else None


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
    cache: Path | None = None,
    no_cache: bool = False,
    wheels: tuple[str, ...] = (),
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
    with tempfile.TemporaryDirectory(prefix="reprobox-context-", dir=cache) as tmp:
        context = _context(Path(tmp), spec, wheels)
        versions = " ".join(spec.repro.requirements(spec.variant, spec.platform))
        cmd = [engine.name, "build", "--target", spec.platform, "-f", str(spec.dockerfile),
               "-t", spec.tag, "--label", f"org.reprobox.versions={versions}"]  # fmt: skip
        if spec.commits:  # which commit each built wheel holds, as the record says it
            commits = " ".join(f"{name}={sha}" for name, sha in spec.commits)
            cmd += ["--label", f"{COMMITS_LABEL}={commits}"]
        args = {
            "INSTALL_ENV": install_env_arg(spec.repro, spec.platform),
            "NO_BUILD_ISOLATION": " ".join(spec.repro.spec.env.no_build_isolation),
            "LOCK_SHA256": spec.lock_sha256, "REPRO": spec.repro.name, "VARIANT": spec.variant,
            "REPRO_COMMAND": shlex.join(_default_command(spec.repro, spec.variant)),
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
            f"lock hash mismatch: image {spec.tag} says {label}, lock is {spec.lock_sha256}",
            exit_code=ExitCode.INTEGRITY,
        )
    log.write_text(log.read_text() + f"built in {time.monotonic() - started:.1f}s\n")
    return True


def push(engine: Engine, spec: ImageSpec, registry: str, results: Path) -> pushes.Pushed:
    """Push the built image of `spec` to `registry` (`REGISTRY/<repro>:<variant>-<platform>-
    <hash>`, or `oci:DIR` for a local OCI layout with podman) and record the digest the push
    reported, so that pods name these very bytes. Nothing is recorded unless the push ends
    well and reports a sha256 digest."""
    if not engine.image_exists(spec.tag):
        raise EnvError(f"image {spec.tag} is not built; build it first (drop --push)")
    suffix = spec.tag.rsplit(":", 1)[-1]
    logs = results / spec.repro.name / "_images" / suffix
    logs.mkdir(parents=True, exist_ok=True)
    if registry.startswith(pushes.LAYOUT_PREFIX):
        if engine.name != "podman":
            raise BadInput(f"--push {registry}: an OCI layout needs podman, not {engine.name}")
        layout = Path(registry[len(pushes.LAYOUT_PREFIX) :]).expanduser().absolute()
        layout.parent.mkdir(parents=True, exist_ok=True)
        dest = f"oci:{layout}:{spec.repro.name}-{suffix}"
        name = f"oci:{layout}"
    else:
        name = pushes.remote_name(registry, spec.repro.name)
        dest = f"{name}:{suffix}"
    log = logs / "push.log"
    with tempfile.TemporaryDirectory(prefix="reprobox-push-") as tmp:
        digest_file = Path(tmp) / "digest"
        if engine.name == "podman":
            target = dest if dest.startswith("oci:") else f"docker://{dest}"
            steps = [[engine.name, "push", "--digestfile", str(digest_file), spec.tag, target]]
        else:
            steps = [[engine.name, "tag", spec.tag, dest], [engine.name, "push", dest]]
        with log.open("w") as sink:
            for cmd in steps:
                sink.write(f"$ {shlex.join(cmd)}\n")
                sink.flush()
                try:  # run() kills the push on a timeout or a signal
                    proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL,
                                          timeout=PUSH_TIMEOUT_S)  # fmt: skip
                except subprocess.TimeoutExpired:
                    took = f"took over {PUSH_TIMEOUT_S}s (log: {log})"
                    raise EngineError(f"push to {dest} {took}") from None
                if proc.returncode != 0:
                    raise EngineError(f"push to {dest} failed: {_last_problem(log)} (log: {log})")
        if engine.name == "podman":
            digest = digest_file.read_text().strip() if digest_file.is_file() else ""
        else:
            digest = _repo_digest(engine, dest, name)
    if not pushes.DIGEST.match(digest):
        raise EngineError(f"push to {dest} reported no sha256 digest ({digest!r}; log: {log})")
    pushed = pushes.Pushed(
        repro=spec.repro.name, variant=spec.variant, platform=spec.platform,
        local_tag=spec.tag, lock_sha256=spec.lock_sha256, registry=registry,
        reference=f"{name}@{digest}", digest=digest, engine=engine.name,
        pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )  # fmt: skip
    pushes.add(results, pushed)
    return pushed


def _repo_digest(engine: Engine, dest: str, name: str) -> str:
    """docker keeps the registry's digest of a pushed image among its RepoDigests."""
    proc = subprocess.run(
        [engine.name, "image", "inspect", "--format", "{{json .RepoDigests}}", dest],
        capture_output=True, text=True,
    )  # fmt: skip
    try:
        digests = json.loads(proc.stdout or "[]") or []
    except json.JSONDecodeError:
        return ""
    return next((d.split("@", 1)[1] for d in digests if d.startswith(f"{name}@")), "")


def _context(directory: Path, spec: ImageSpec, wheel_folders: tuple[str, ...]) -> Path:
    """Assemble the build context (see images/README.md)."""
    shutil.copy2(spec.lock, directory / "lock.txt")  # mtimes kept: buildah caches by them
    shutil.copy2(spec.dockerfile.parent.parent / "install-lock.sh", directory / "install-lock.sh")
    ignore = shutil.ignore_patterns("__pycache__", "locks")
    shutil.copytree(spec.repro.dir, directory / "repro", ignore=ignore)
    shutil.copytree(spec.repro.fixes_dir, directory / "fixes", ignore=ignore)
    (directory / "wheels").mkdir()
    (directory / "tools").mkdir()
    _link(Path(uv.uv_bin()), directory / "tools" / "uv")
    for wheel in spec.wheels:  # built from a git commit or a checkout, on any platform
        _link(wheel, directory / "wheels" / wheel.name)
    pinned = venvs.lock_pins(spec.lock.read_text())
    for folder in wheel_folders if spec.platform == "cpu" else ():
        for wheel in Path(folder).glob("*.whl"):
            try:
                name, version, _, _ = parse_wheel_filename(wheel.name)
            except InvalidWheelFilename:
                continue
            if pinned.get(name) == version:  # 2.13.0 is not 2.13.0+cpu
                _link(wheel, directory / "wheels" / wheel.name)
    return directory


def _default_command(repro: Repro, variant: str) -> list[str]:
    """What the image runs when a person starts it with no command: the variant itself."""
    return container_argv(repro, variant, script_args(repro, make_cell(repro, variant)))


def _link(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


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


def _passed(request: LaunchRequest) -> list[str]:
    """The [launch] pass_env names set in the harness's environment."""
    return [name for name in request.launch.pass_env if name in os.environ]


def _quiet(cmd: list[str]) -> int:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1


class ContainerBackend:
    """Runs launches inside each variant's pinned image (podman or docker), judged exactly
    as venv runs are: the pipeline's preflight, batching and judge apply unchanged."""

    name = "container"

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        base: str | None = None,
        no_cache: bool = False,
        memory: str | None = None,
    ) -> None:
        self.settings, self.engine, self.base, self.no_cache = settings, engine, base, no_cache
        self.memory = check_memory(memory) if memory else None  # None: default_memory
        self.built: list[tuple[str, bool, float]] = []  # (tag, built now, seconds)

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        _, commits = resolve_sources(dict(cell.packages), self.settings)  # resolved already
        spec = image_spec(self.settings.root, repro, cell.variant, cell.platform, lock, commits)
        logs = self.settings.results / repro.name / "_images" / spec.tag.rsplit(":", 1)[-1]
        started = time.monotonic()
        built = build(
            self.engine,
            spec,
            base=self.base,
            ca_bundle=self.settings.ca_bundle,
            log_dir=logs,
            cache=self.settings.cache,
            wheels=find_links(self.settings),
            no_cache=self.no_cache and spec.tag not in {t for t, _, _ in self.built},
        )
        self.built.append((spec.tag, built, time.monotonic() - started))
        return Prepared(
            key=spec.tag,
            lock=lock,
            lock_hash=spec.tag.rsplit("-", 1)[-1],
            runner=f"{self.engine.name} {spec.tag}",
            env_s=time.monotonic() - started,
            handle=spec,
        )

    def _run_argv(self, prepared: Prepared, request: LaunchRequest, name: str) -> list[str]:
        spec: ImageSpec = prepared.handle
        lead = request.lead
        preflight = list(request.preflight) if request.preflight is not None else None
        if len(request.cases) > 1 and preflight is None:
            plan = lead.run_dir / PLAN_FILE
            paths = [str(case_out(i) / RESULT_FILE) for i in range(len(request.cases))]
            plan.write_text(plan_text(request, paths))
            protocol, args = {PLAN_ENV: str(OUT / PLAN_FILE)}, []
        else:
            protocol, args = {RESULT_ENV: str(OUT / RESULT_FILE)}, list(lead.args)
        env = {**request.launch.env, **protocol, CACHE_ENV: str(CACHE),
               "PYTHONPATH": str(IN_IMAGE["fixes"]), "HF_HUB_OFFLINE": "1"}  # fmt: skip
        cache = self.settings.cache / "repro-cache" / f"{request.repro.name}-image"
        cache.mkdir(parents=True, exist_ok=True)
        out = request.log_dir
        out.mkdir(parents=True, exist_ok=True)
        memory = self.memory or default_memory(request.launch.processes)
        cmd = [self.engine.name, "run", "--rm", "--name", name,
               *self.engine.confine_flags(memory), *self.engine.user_flags(),
               *self.engine.out_mount(out), *self.engine.out_mount(cache, CACHE)]  # fmt: skip
        for index, case in enumerate(request.cases[1:], start=1):
            cmd += self.engine.out_mount(case.run_dir, case_out(index))
        for key, value in env.items():
            cmd += ["-e", f"{key}={value}"]
        for key in _passed(request):  # the engine reads the value here: never in the argv
            cmd += ["-e", key]
        gpus = self.engine.gpu_flags() if spec.platform == "gpu" else []
        argv = container_argv(request.repro, lead.cell.variant, args, preflight=preflight)
        return [*cmd, *gpus, spec.tag, *argv]

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return self._run_argv(prepared, request, "reprobox-NAME")

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The variables the harness hands the container (`-e`; names only, for the
        record): nothing of its own environment but [launch] pass_env."""
        argv = self._run_argv(prepared, request, "reprobox-NAME")
        return sorted({argv[i + 1].split("=", 1)[0] for i, a in enumerate(argv[:-1]) if a == "-e"})

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        name = f"reprobox-{uuid.uuid4().hex[:12]}"
        cmd = self._run_argv(prepared, request, name)
        log = request.log_dir / "launch.log"
        started = time.monotonic()
        timed_out = False
        # If the harness dies (kill -9), its watchdog removes the container: `podman run`
        # and the container itself would otherwise run on for ever.
        guard = watchdog.Watcher(name)
        guard.container(self.engine.name, name)
        with log.open("wb") as sink:
            sink.write(f"$ {shlex.join(cmd)}\n".encode())
            sink.flush()
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
            guard.process(proc.pid)
            try:
                proc.wait(timeout=request.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                self.engine.remove(name)
                proc.wait()
            except BaseException:
                self.engine.remove(name)
                proc.wait()
                raise
            finally:
                guard.done()
        if request.preflight is not None and (request.log_dir / RESULT_FILE).is_file():
            # The preflight's /out is its own folder; its result is the cell's.
            (request.log_dir / RESULT_FILE).replace(request.lead.result)
        rank_logs = collect_rank_logs(request.log_dir)
        return Launched(
            exits=() if timed_out else launcher_exits(proc.returncode, log),
            timed_out=timed_out,
            timeout=request.timeout,
            wall_s=time.monotonic() - started,
            logs=request.lead.run_dir,
            last_error=last_error([log, *rank_logs]),
            launcher_stops_peers=True,
            stopped=f"container {name} killed and removed",
        )
