"""Virtual environments, content-addressed by their lock.

Two variants, matrix cells or bisect probes with the same lock share one venv, and uv's
cache makes a new one cheap (and a rebuilt one: a ready venv that no longer matches its
lock is rebuilt).

With the host's torch (REPROBOX_TORCH_SOURCE=host) the venv is made with the host's
interpreter and installs the lock's host flavour (no torch, no CUDA wheels); a `.pth` file
in its site-packages names the folder holding the host's torch, then the host's other
package folders (where torch's own dependencies are). A `.pth` line is appended to
`sys.path` after the venv's own site-packages, so the lock's pins win over the host's copies
of the same packages; and it works alike for a system, conda or venv host
(`--system-site-packages` would show a venv host's base interpreter, not the venv's torch).
Packages only the host has (torch's own CUDA wheels) stay importable from there.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from reprobox.core.errors import EnvError
from reprobox.core.settings import Settings
from reprobox.envs import intact, locks, torch_source, wheelhouse
from reprobox.envs.uv import run_uv, uv_bin

READY_MARKER = ".reprobox-ready"
# What an import reads (and the venv's scripts, `../../../bin/torchrun`): the files whose
# loss would break every run with an ImportError rather than fail where it is used.
IMPORTED = (".py", ".so", ".pth")
TORCH_SOURCE_NOTE = ".reprobox-torch-source"  # written at install: asking pip again costs 0.3 s
HOST_TORCH_NOTE = ".reprobox-host-torch.json"  # the host torch a host venv was built against
HOST_TORCH_PTH = "_reprobox_host_torch.pth"  # names the folder holding the host's torch


@dataclass(frozen=True)
class Env:
    """A ready virtual environment."""

    path: Path
    lock_hash: str
    created: bool = field(default=False, compare=False)
    # Why a ready environment was rebuilt (it lost a file, a package was changed by hand).
    repaired: str = field(default="", compare=False)
    # REPROBOX_TORCH_SOURCE=host: the host's torch this environment imports.
    host_torch: torch_source.HostTorch | None = field(default=None, compare=False)
    host_lock: Path | None = field(default=None, compare=False)  # the lock's host flavour

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    @property
    def torch_source(self) -> str:
        """Where this environment's torch came from, as noted when it was installed."""
        try:
            return (self.path / TORCH_SOURCE_NOTE).read_text().strip()
        except OSError:
            return ""


def env_hash(
    lock: Path, python: str, install_env: dict[str, str], no_build_isolation: Sequence[str] = ()
) -> str:
    body = "\n".join(line for line in lock.read_text().splitlines() if not line.startswith("#"))
    inputs: dict[str, object] = {"lock": body, "python": python, "env": install_env}
    if no_build_isolation:
        inputs["late"] = sorted(no_build_isolation)
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def ensure_env(
    lock: Path,
    python: str,
    install_env: dict[str, str] | None = None,
    no_build_isolation: Sequence[str] = (),
    *,
    settings: Settings,
    host_packages: Sequence[str] = (),
) -> Env:
    """Return the venv for `lock`, creating it (under a file lock) if it is not ready.

    A venv only counts once its marker is written, so one interrupted mid-install is rebuilt
    rather than trusted; concurrent runs wait for each other instead of installing twice.
    A ready venv is checked against its lock before it is reused (`check_env`): one that lost
    a file or had a package changed by hand is rebuilt (`Env.repaired` says why), not
    trusted to fail every run with an ImportError.
    Packages in `no_build_isolation` (whose source build imports others from the lock, as
    deepspeed's imports torch) are installed last, against the venv.
    With the host's torch, `host_packages` (the platform's) come from the host too.
    """
    install_env = install_env or {}
    host: torch_source.HostTorch | None = None
    lock_python = python
    if settings.torch_source == "host":  # the lock without torch, in the host's interpreter
        host = torch_source.probe_host(
            settings.host_python, tuple(host_packages), timeout=settings.host_probe_timeout
        )
        lock, python = locks.host_lock(lock, settings, host_packages), host.python
    digest = env_hash(lock, python, install_env, no_build_isolation)
    path = settings.cache / "envs" / digest
    problem = _host_problem(path, host) or ready_problem(path, lock)
    if problem is None:
        return Env(path, digest, host_torch=host, host_lock=lock if host else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        problem = _host_problem(path, host) or ready_problem(path, lock)
        if problem is None:
            return Env(path, digest, host_torch=host, host_lock=lock if host else None)
        _install(path, lock, python, install_env, no_build_isolation, settings, host)
        after = check_env(path, lock.read_text())
        if after is not None:
            raise EnvError(
                f"the environment {path} is incomplete right after installing {lock.name}: "
                f"{after}; remove it (rm -rf {path}) and run again"
            )
        if host is not None:
            _check_host_import(path, host, settings.host_probe_timeout)
            (path / HOST_TORCH_NOTE).write_text(json.dumps(host.identity, sort_keys=True))
        described = (
            host.describe(lock_python)
            if host is not None
            else torch_source.from_settings(settings).describe()
        )
        (path / TORCH_SOURCE_NOTE).write_text(described + "\n")
        (path / READY_MARKER).write_text(lock.read_text())
    _CHECKED.add((path, _marker_stamp(path)))
    repaired = "" if problem == _NOT_READY else problem
    return Env(
        path, digest, created=True, repaired=repaired, host_torch=host,
        host_lock=lock if host else None,
    )  # fmt: skip


def _host_problem(path: Path, host: torch_source.HostTorch | None) -> str | None:
    """Why a ready host venv no longer matches the host's torch (another version, another
    folder, another interpreter: it is rebuilt), or None. Not one for the host's torch: None."""
    if host is None or _marker_stamp(path) < 0:
        return None
    try:
        built = json.loads((path / HOST_TORCH_NOTE).read_text())
    except (OSError, ValueError):
        return "its note of the host's torch is missing"
    if built == host.identity:
        return None
    was = f"{built.get('version')} at {built.get('site')}"
    return f"the host's torch changed ({was} -> {host.version} at {host.site})"


def _host_scripts(path: Path, host: torch_source.HostTorch) -> None:
    """torch's commands (`torchrun`) in the venv's bin, run by the venv's python: the
    launcher starts `<venv>/bin/torchrun`, and the host's own would run the host's python
    without the lock's packages."""
    python = path / "bin" / "python"
    for name, target in host.scripts:
        module, _, attr = target.partition(":")
        call = attr.split("[", 1)[0].strip() or "main"
        script = path / "bin" / name
        script.write_text(
            f"#!{python}\nimport sys\nfrom {module.strip()} import {call.split('.')[0]}\n"
            f"sys.exit({call}())\n"
        )
        script.chmod(0o755)


def _check_host_import(
    path: Path, host: torch_source.HostTorch, timeout: float | None = None
) -> None:
    """The venv must import the host's torch, from the host's folder: proves the `.pth`
    works, and that the lock's packages (say an older numpy) do not break torch's import."""
    names = [name for name, _, _ in host.packages]
    code = (
        "import importlib.metadata as md, sys, torch; "
        f"[print(md.version(n)) for n in {names!r}]; print(torch.__file__); "
        "print(torch.__version__)"
    )
    what = f"the host venv {path}"
    proc = torch_source.run_import([str(path / "bin" / "python"), "-c", code], what, timeout, path)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) < 2:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise EnvError(f"the host venv {path} cannot import the host's torch: {last}")
    if not Path(lines[-2]).resolve().is_relative_to(Path(host.site).resolve()):
        raise EnvError(
            f"the host venv {path} imports torch from {lines[-2]}, not the host's {host.site}"
        )
    for (name, version, _), seen in zip(host.packages, lines, strict=False):
        if seen != version:  # the venv has none of its own: it sees the host's
            raise EnvError(f"the host venv {path} sees {name} {seen}, not the host's {version}")


def _install(
    path: Path,
    lock: Path,
    python: str,
    install_env: dict[str, str],
    no_build_isolation: Sequence[str],
    settings: Settings,
    host: torch_source.HostTorch | None = None,
) -> None:
    """Create the venv at `path` afresh and install the lock into it (no marker yet). A host
    venv sees the host's torch from the start (a late source build, DeepSpeed's, imports
    it)."""
    shutil.rmtree(path, ignore_errors=True)
    venv = [uv_bin(), "venv", "--quiet", "--python", python, str(path)]
    run_uv(venv, what="create venv", settings=settings)
    if host is not None:
        site = site_packages(path)
        if site is None:
            raise EnvError(f"the venv {path} made with {host.python} has no site-packages")
        (site / HOST_TORCH_PTH).write_text("".join(f"{folder}\n" for folder in host.sites))
        _host_scripts(path, host)
    # A wheelhouse (REPROBOX_WHEELHOUSE) replaces every index: an offline node installs from it.
    links = wheelhouse.install_args(settings) or torch_args(lock.read_text(), settings)
    pip = [uv_bin(), "pip", "--quiet"]
    target = ["--require-hashes", "--python", str(path / "bin" / "python"), *links]
    first, late = split_lock(lock.read_text(), no_build_isolation)
    parts = path.with_name(path.name + ".parts")
    parts.mkdir(exist_ok=True)
    (parts / "first.txt").write_text(first)
    sync = [*pip, "sync", *target, str(parts / "first.txt")]
    run_uv(sync, what="install", env=install_env, settings=settings)
    if late:
        (parts / "late.txt").write_text(late)
        late_cmd = [*pip, "install", "--no-deps", "--no-build-isolation", *target]
        late_cmd += ["-r", str(parts / "late.txt")]
        run_uv(late_cmd, what="install", env=install_env, settings=settings)
    shutil.rmtree(parts, ignore_errors=True)


# ---- is a ready environment still what its lock installed? ----------------------------------

_NOT_READY = "not built yet (or its install was interrupted)"
# (env, marker mtime) checked by this process: a batch of cells, a bisect's probes sharing one
# environment check it once.
_CHECKED: set[tuple[Path, float]] = set()


def _marker_stamp(path: Path) -> float:
    try:
        return (path / READY_MARKER).stat().st_mtime
    except OSError:
        return -1.0


def ready_problem(path: Path, lock: Path) -> str | None:
    """None when the venv at `path` is ready for `lock` and intact; else why it is not."""
    stamp = _marker_stamp(path)
    if stamp < 0:
        return _NOT_READY
    if (path, stamp) in _CHECKED:
        return None
    lock_text = lock.read_text()
    if intact.unchanged(path, stamp, lock_text):  # no folder changed since a passing check
        _CHECKED.add((path, stamp))
        return None
    folders: dict[str, int] = {}
    problem = check_env(path, lock_text, folders)
    if problem is None:
        _CHECKED.add((path, stamp))
        intact.remember(path, stamp, lock_text, folders)
    return problem


def lock_pins(text: str) -> dict[NormalizedName, Version]:
    """The exact version of every distribution a hashed lock installs."""
    pins: dict[NormalizedName, Version] = {}
    for line in text.splitlines():
        if not line.strip() or line[0] in " #-":
            continue
        try:
            requirement = Requirement(line.rstrip(" \\"))
        except InvalidRequirement:
            continue
        if requirement.url and requirement.url.endswith(".whl"):  # a wheel built from git
            try:
                _, version, _, _ = parse_wheel_filename(requirement.url.rsplit("/", 1)[-1])
            except InvalidWheelFilename:
                continue
            pins[canonicalize_name(requirement.name)] = version
            continue
        for spec in requirement.specifier:
            if spec.operator == "==":
                try:
                    pins[canonicalize_name(requirement.name)] = Version(spec.version)
                except InvalidVersion:
                    continue
    return pins


def site_packages(path: Path) -> Path | None:
    """The venv's site-packages folder (None: the venv has none)."""
    found = sorted((path / "lib").glob("python*/site-packages"))
    return found[0] if found else None


def installed(site: Path) -> dict[NormalizedName, tuple[Version | None, Path]]:
    """Distributions installed in `site`, from their `*.dist-info` folder names (no file
    is read: the wheel spec writes name and version into the folder's name)."""
    found: dict[NormalizedName, tuple[Version | None, Path]] = {}
    for entry in os.scandir(site):
        if not entry.name.endswith(".dist-info"):
            continue
        name, _, version = entry.name[: -len(".dist-info")].partition("-")
        try:
            parsed: Version | None = Version(version)
        except InvalidVersion:
            parsed = None
        found[canonicalize_name(name)] = (parsed, Path(entry.path))
    return found


def check_env(path: Path, lock_text: str, folders: dict[str, int] | None = None) -> str | None:
    """Why the venv at `path` no longer holds what `lock_text` installs, in a few words, or
    None: every pinned distribution installed at its pinned version, nothing else, and every
    module their RECORDs list still there (a lost one would otherwise be an ImportError on
    every run). Costs a directory listing and a stat per installed module (about 40 ms for a
    torch environment; its 10,000 headers are not looked at). `folders` gets the ctime of
    each folder holding them (relative to `path`), each taken before its files are stat'ed:
    what `intact` trusts later."""
    site = site_packages(path)
    if site is None:
        return "it has no site-packages folder"
    seen = _Folders(path, site, folders)
    seen.add("")  # before its listing: a distribution added or renamed changes it
    pins = lock_pins(lock_text)
    have = installed(site)
    missing = sorted(name for name in pins if name not in have)
    if missing:
        return f"{_few(missing)} not installed"
    changed = [
        f"{name} {version} (the lock pins {pins[name]})"
        for name, (version, _) in sorted(have.items())
        if name in pins and version != pins[name]
    ]
    if changed:
        return f"{_few(changed)} installed"
    extra = sorted(name for name in have if name not in pins)
    if extra:
        return f"{_few(extra)} installed but not in the lock"
    for name, (_, dist_info) in sorted(have.items()):
        lost = _lost_files(site, dist_info, seen)
        if lost:
            return f"{name} lost {lost}"
    return None


class _Folders:
    """The ctimes `check_env` hands back: each folder's, taken the first time it is named."""

    def __init__(self, env: Path, site: Path, into: dict[str, int] | None) -> None:
        self._site, self._into = str(site), into
        self._prefix = os.path.relpath(site, env)

    def add(self, folder: str) -> None:
        if self._into is None:
            return
        key = os.path.normpath(os.path.join(self._prefix, folder))
        if key not in self._into:
            self._into[key] = intact.ctime_ns(os.path.join(self._site, folder))


def _lost_files(site: Path, dist_info: Path, seen: _Folders) -> str | None:
    """The first file a distribution's RECORD lists that is gone (or the RECORD itself)."""
    base = str(site)
    try:
        text = (dist_info / "RECORD").read_text(errors="replace")
    except OSError:
        return f"{dist_info.name}/RECORD"
    listed = []
    for line in text.splitlines():
        # RECORD is CSV: path,hash,size; a path with a comma is quoted (rare: then parsed).
        relative = line.rsplit(",", 2)[0] if not line.startswith('"') else _csv_path(line)
        if relative.endswith(IMPORTED) or relative.startswith("../"):
            listed.append(relative)  # not headers and data: a lost one fails where it is used
    for folder in {os.path.dirname(relative) for relative in listed}:
        seen.add(folder)  # before its files: a file lost after the stat changes its ctime
    for relative in listed:
        try:
            os.stat(os.path.join(base, relative))
        except FileNotFoundError:
            return os.path.normpath(relative)
        except OSError:
            continue
    return None


def _csv_path(line: str) -> str:
    row = next(csv.reader([line]), [])
    return row[0] if row else ""


def _few(items: Sequence[str]) -> str:
    shown = ", ".join(items[:3])
    return shown + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def torch_args(lock_text: str, settings: Settings) -> list[str]:
    """The torch sources an install of this lock needs: a CPU build (`+cpu`) only lives on
    them; the default index's build (a GPU lock, the pypi flavour) must not be shadowed by
    a same-numbered local build from them."""
    torch = torch_source.pinned_torch(lock_text)
    if torch is None or torch.local is None:
        return []
    return dataclasses.replace(torch_source.from_settings(settings), flavour="cpu").uv_args()


def split_lock(text: str, late: Sequence[str]) -> tuple[str, str]:
    """A lock's entries without, and with only, the `late` packages (two installable files)."""
    wanted = {canonicalize_name(name) for name in late}
    first: list[str] = []
    second: list[str] = []
    target = first
    for line in text.splitlines(keepends=True):
        if line[:1] not in ("", " ", "#", "\n"):
            name = re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]
            target = second if canonicalize_name(name) in wanted else first
        target.append(line)
    return "".join(first), "".join(second)
