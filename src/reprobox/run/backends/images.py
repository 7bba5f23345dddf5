"""Pinned images: a variant's image from its lock (tagged by the hash of everything that goes
in), built once, and pushed to a registry with the digest it got recorded (run/pushes.py),
which `reprobox k8s` names instead of a tag.

The image installs the very lock the nox environment uses (images/install-lock.sh), runs as
a non-root user, and writes its result to a mounted /out.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from reprobox.core.cells import make_cell, script_args
from reprobox.core.errors import BadInput, EngineError, EnvError, ExitCode
from reprobox.core.files import atomic_write
from reprobox.core.spec import Repro
from reprobox.envs import uv, venvs
from reprobox.run import pushes
from reprobox.run.backend import Handle
from reprobox.run.backends.engine import Engine
from reprobox.run.dockerfile import install_env_arg
from reprobox.run.layout import BUILD_WHEELS, container_argv

BUILD_TIMEOUT_S = 3600
PUSH_TIMEOUT_S = 3600
COMMITS_LABEL = "org.reprobox.commits"  # `name=sha ...`: the commits of built wheels


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

    @property
    def host_torch(self) -> None:
        """An image runs its own torch, never the host's (REPROBOX_TORCH_SOURCE=host)."""
        return None

    @property
    def host_lock(self) -> None:
        return None


def image_of(handle: Handle) -> ImageSpec:
    """The image a container back end prepared (a handle of another back end is a bug)."""
    if not isinstance(handle, ImageSpec):
        raise TypeError(f"not an image: {type(handle).__name__}")
    return handle


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
    tag = f"{TAG_PREFIX}{repro.name}:{variant}-{platform}-{digest.hexdigest()[:12]}"
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
    label = _inspect_label(engine, spec.tag, LOCK_LABEL)
    if label != spec.lock_sha256:
        raise EnvError(
            f"lock hash mismatch: image {spec.tag} says {label}, lock is {spec.lock_sha256}",
            exit_code=ExitCode.INTEGRITY,
        )
    log.write_text(log.read_text() + f"built in {time.monotonic() - started:.1f}s\n")
    return True


def push(engine: Engine, image: Handle, registry: str, results: Path) -> pushes.Pushed:
    """Push the built image of `spec` to `registry` (`REGISTRY/<repro>:<variant>-<platform>-
    <hash>`, or `oci:DIR` for a local OCI layout with podman) and record the digest the push
    reported, so that pods name these very bytes. Nothing is recorded unless the push ends
    well and reports a sha256 digest."""
    spec = image_of(image)
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


LOCK_LABEL = "org.reprobox.lock-sha256"  # every image the harness built carries it


def image_id(engine: Engine, tag: str) -> str:
    """The built image's own digest (`sha256:...` of its config), which the record names:
    a tag names whatever was built last, the digest these very bytes."""
    proc = subprocess.run([engine.name, "image", "inspect", "--format", "{{.Id}}", tag],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    found = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not found:
        raise EngineError(f"{engine.name} cannot inspect the image it built ({tag})")
    return found if found.startswith("sha256:") else f"sha256:{found}"


@dataclass(frozen=True)
class Stored:
    """One image the harness built, as the engine stores it."""

    id: str
    tags: tuple[str, ...]
    size: int  # bytes, its layers shared with other images included
    created: str  # the engine's timestamp, compared by its first 19 characters


TAG_PREFIX = "localhost/reprobox/"  # every tag `image_spec` gives


def stored(engine: Engine, prefix: str = TAG_PREFIX) -> list[Stored]:
    """Every image the harness built (its lock label, a tag under `prefix`), oldest
    first."""
    listed = subprocess.run([engine.name, "images", "-q", "--no-trunc", "--filter",
                             f"label={LOCK_LABEL}"], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    ids = list(dict.fromkeys(listed.stdout.split()))
    if listed.returncode != 0 or not ids:
        return []
    # podman 4.3 cannot render `json .Id`; a timestamp has no tab, a JSON list no tab either
    fmt = "{{.Id}}\t{{json .RepoTags}}\t{{.Size}}\t{{.Created}}"
    names = [ident.removeprefix("sha256:") for ident in ids]
    proc = subprocess.run([engine.name, "image", "inspect", "--format", fmt, *names],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    found = []
    for line in proc.stdout.splitlines():
        try:
            ident, tags, size, created = line.split("\t")
            named = tuple(json.loads(tags) or ())
            found.append(Stored(ident, named, int(size), created))
        except (ValueError, TypeError):
            continue
    found = [image for image in found if any(t.startswith(prefix) for t in image.tags)]
    return sorted(found, key=lambda image: image.created[:19].replace("T", " "))


def prune(engine: Engine, bound: int, keep: set[str], prefix: str = TAG_PREFIX) -> list[str]:
    """Remove the harness's images, oldest first, until their sizes add up to at most
    `bound` bytes (a shared layer is counted in each image that holds it, so the bound is
    never exceeded on disk); images tagged in `keep` (this run's) and images a container
    still uses stay. The tags removed."""
    images = stored(engine, prefix)
    total = sum(image.size for image in images)
    removed: list[str] = []
    for image in images:
        if total <= bound:
            break
        if keep & set(image.tags):
            continue
        if _quiet_rmi(engine, list(image.tags) or [image.id]):
            total -= image.size
            removed += list(image.tags) or [image.id]
    return removed


def _quiet_rmi(engine: Engine, names: list[str]) -> bool:
    """Remove an image by all its tags (never forced: one a container uses stays)."""
    proc = subprocess.run([engine.name, "rmi", *names], capture_output=True, timeout=300)
    return proc.returncode == 0


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
