"""Locks: `uv pip compile --generate-hashes` output headed by the hash of its inputs and the
hash of its own body.

A stale lock is caught without touching the network; a lock for an override (a matrix cell, a
bisect probe) is resolved once into the cache. The header's first line,
`# reprobox-lock input=<inputs> body=<sha256>`, covers everything below it: a lock edited
by hand (a pin or a hash changed, its header kept) or corrupted is an integrity error
wherever it is used (`check_body`), never installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from reprobox.core.errors import BadInput, EnvError, ExitCode
from reprobox.core.files import atomic_write
from reprobox.core.settings import Settings
from reprobox.envs import torch_source, wheelhouse
from reprobox.envs.host_entries import without_host_torch
from reprobox.envs.uv import run_uv, uv_bin

LOCK_HEADER = "# reprobox-lock input="
_HEADER = re.compile(r"# reprobox-lock input=(?P<input>\S+)(?: body=(?P<body>[0-9a-f]{64}))?\s*")
# Locks target Linux x86-64 so a lock regenerates the same anywhere (the images run there too).
PLATFORM_TAGS = {"cpu": "x86_64-manylinux_2_28", "gpu": "x86_64-manylinux_2_28"}
# An `exclude_newer_packages` date past any upload: that package's cut-off lifted (uv takes
# no "none"; a year above 9999 is refused).
NO_CUTOFF = "9000-01-01"


@dataclass(frozen=True)
class LockRequest:
    """Everything that determines a lock's content."""

    requirements: tuple[str, ...]
    python: str
    platform: str = "cpu"
    exclude_newer: str | None = None
    # (package, date): resolve these packages as of an earlier date (date bisection)
    exclude_newer_packages: tuple[tuple[str, str], ...] = ()
    # cpu: a CPU lock pins the CPU build of torch | pypi: the default index's build (the
    # fallback flavour; cached, never committed). Not part of a GPU lock. The host flavour
    # (REPROBOX_TORCH_SOURCE=host) is no resolution: it is derived from a lock (`host_lock`).
    torch_source: str = "cpu"

    @property
    def input_hash(self) -> str:
        payload: dict[str, object] = {
            "requirements": sorted(self.requirements),
            "python": self.python,
            "platform": self.platform,
            "exclude_newer": self.exclude_newer,
        }
        if self.exclude_newer_packages:
            payload["exclude_newer_packages"] = sorted(self.exclude_newer_packages)
        if self.torch_source != "cpu":  # the committed locks' hashes stay as they are
            payload["torch_source"] = self.torch_source
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _header(lock: Path) -> re.Match[str] | None:
    try:
        with lock.open(encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
    except (FileNotFoundError, IsADirectoryError):
        return None
    return _HEADER.fullmatch(first.rstrip("\n"))


def lock_input_hash(lock: Path) -> str | None:
    """The input hash a lock was generated from, or None if it has no reprobox header."""
    header = _header(lock)
    return header["input"] if header else None


def body_hash(body: bytes) -> str:
    """The sha256 of a lock's body: every byte below its first line."""
    return hashlib.sha256(body).hexdigest()


def header_line(input_hash: str, body: bytes) -> str:
    """The first line of a lock: its inputs' hash and its body's."""
    return f"{LOCK_HEADER}{input_hash} body={body_hash(body)}"


def body_problem(lock: Path) -> str | None:
    """Why a lock's body cannot be trusted (`no body hash`, `edited or corrupt`), or None."""
    data = lock.read_bytes()
    first, _, body = data.partition(b"\n")
    header = _HEADER.fullmatch(first.decode("utf-8", errors="replace"))
    if header is None:
        return "no reprobox header"
    if header["body"] is None:
        return "no body hash (written before locks carried one)"
    if header["body"] != body_hash(body):
        return "its body does not match the hash in its header (edited by hand, or corrupt)"
    return None


def check_body(lock: Path, shown: str | None = None) -> None:
    """Refuse a lock whose body is not the one its header names: a mismatch is an integrity
    error (exit 6: never a skip, a bisect stops on it); a lock with no body hash yet is
    bad input (regenerate it)."""
    problem = body_problem(lock)
    if problem is None:
        return
    name = shown or str(lock)
    if problem.startswith("its body"):
        raise EnvError(
            f"{name}: {problem}; regenerate it with `nox -s lock` (or restore it from git)",
            exit_code=ExitCode.INTEGRITY,
        )
    raise BadInput(f"{name}: {problem}; regenerate it with `nox -s lock`")


def compile_lock(request: LockRequest, dest: Path, settings: Settings) -> Path:
    """Resolve `request` with uv into a hashed lock at `dest` (written atomically)."""
    cmd = [
        uv_bin(),
        "pip",
        "compile",
        "-",
        "--quiet",
        "--generate-hashes",
        "--no-header",
        "--python-version",
        request.python,
        "--python-platform",
        PLATFORM_TAGS.get(request.platform, PLATFORM_TAGS["cpu"]),
    ]
    if request.exclude_newer:
        cmd += ["--exclude-newer", request.exclude_newer]
    for package, date in request.exclude_newer_packages:
        cmd += ["--exclude-newer-package", f"{package}={date}"]
    source = torch_source.from_settings(settings)
    pypi = request.torch_source == "pypi"
    if request.platform == "cpu":
        cmd += dataclasses.replace(source, flavour=request.torch_source).uv_args()
    cmd += wheelhouse.install_args(settings)  # offline: resolve from the wheelhouse alone
    requirements = [_without_local(r) if pypi else r for r in request.requirements]
    proc = run_uv(cmd, stdin="\n".join(requirements) + "\n", what="resolve", settings=settings)
    if request.platform == "cpu" and not pypi:
        _check_cpu_torch(proc.stdout, source)
    header = [
        f"# python {request.python}, platform {request.platform}"
        + (f", as of {request.exclude_newer}" if request.exclude_newer else "")
        + "".join(f", {p} as of {d}" for p, d in request.exclude_newer_packages)
        + (", torch from the default index (REPROBOX_TORCH_SOURCE=pypi)" if pypi else ""),
        *(f"#   {req}" for req in request.requirements),
        "# Regenerate with: nox -s lock",
    ]
    body = ("\n".join(header) + "\n" + proc.stdout).encode()
    body += b"" if body.endswith(b"\n") else b"\n"  # as atomic_write ends it
    return atomic_write(dest, header_line(request.input_hash, body) + "\n" + body.decode())


def for_torch_source(request: LockRequest, flavour: str) -> LockRequest:
    """`request` in the torch flavour asked for (REPROBOX_TORCH_SOURCE): a CPU lock becomes
    its pypi flavour; a GPU lock stays as it is. The host flavour resolves as pypi (a host
    with its own torch need not reach a CPU-torch index: torch is dropped afterwards, by
    `host_lock`)."""
    flavour = "pypi" if flavour == "host" else flavour
    if request.platform != "cpu" or request.torch_source == flavour:
        return request
    return dataclasses.replace(request, torch_source=flavour)


# ---- the host flavour: a lock without torch (REPROBOX_TORCH_SOURCE=host) --------------------

HOST_FLAVOUR = "host"


def host_lock(lock: Path, settings: Settings, also: Sequence[str] = ()) -> Path:
    """The host flavour of `lock` (committed or cached): its entries minus torch, the CUDA
    runtime wheels and the platform's `host_packages` (`without_host_torch`), derived with
    no resolution (offline), headed and body-hashed like every lock and cached under its own
    input hash (so its environment's key differs from the pinned one's). A base lock that
    fails its own body hash is refused first (`check_body`)."""
    check_body(lock)
    first, _, base_body = lock.read_text().partition("\n")
    base = _HEADER.fullmatch(first.rstrip("\n"))
    assert base is not None  # check_body passed
    inputs: dict[str, object] = {
        "base": base["input"], "base_body": base["body"], "torch_source": HOST_FLAVOUR
    }  # fmt: skip
    if also:
        inputs["host_packages"] = sorted(also)
    input_hash = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    dest = settings.cache / "locks" / f"{input_hash}.txt"
    header = _header(dest)
    if header is None or header["input"] != input_hash or body_problem(dest) is not None:
        kept, dropped = without_host_torch(base_body, also)
        body = (
            f"# host flavour (REPROBOX_TORCH_SOURCE=host) of {lock.name}: without "
            f"{', '.join(dropped) or 'nothing'} (the host's torch brings them)\n" + kept
        ).encode()
        body += b"" if body.endswith(b"\n") else b"\n"
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest) + ".lock"):
            atomic_write(dest, header_line(input_hash, body) + "\n" + body.decode())
    check_body(dest)
    return dest


def _check_cpu_torch(lock_text: str, source: torch_source.TorchSource) -> None:
    """A CPU lock must pin the CPU build: where no source serves it, uv quietly falls back
    to the default index's CUDA build, and a lock would then say `cpu` and mean otherwise."""
    torch = torch_source.pinned_torch(lock_text)
    if torch is not None and torch.local is None:
        raise EnvError(
            f"cannot resolve: only the default index's torch=={torch} (the CUDA build) was "
            f"found, not the CPU build (tried: {source.tried()}); {source.hint()}"
        )


def _without_local(requirement: str) -> str:
    """`torch==2.13.0+cpu` as `torch==2.13.0`: the pypi flavour has no local builds."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return requirement
    if canonicalize_name(req.name) != "torch":
        return requirement
    specs = []
    for spec in req.specifier:
        version = spec.version.split("+", 1)[0] if spec.operator == "==" else spec.version
        specs.append(f"{spec.operator}{version}")
    req.specifier = type(req.specifier)(",".join(specs))
    return str(req)


def cached_lock(request: LockRequest, settings: Settings) -> Path:
    """A lock for `request` from the cache, resolved once (for cells and probes), in the torch
    flavour the settings ask for (`for_torch_source`). One cached before locks carried a body
    hash is resolved again; one whose body no longer matches its hash is refused."""
    request = for_torch_source(request, settings.torch_source)
    dest = settings.cache / "locks" / f"{request.input_hash}.txt"
    if not _cached_current(dest, request):
        with FileLock(str(dest) + ".lock"):
            if not _cached_current(dest, request):
                compile_lock(request, dest, settings)
    check_body(dest)
    return dest


def _cached_current(dest: Path, request: LockRequest) -> bool:
    """Whether the cached lock was resolved for `request` and carries a body hash."""
    header = _header(dest)
    return header is not None and header["input"] == request.input_hash and bool(header["body"])
