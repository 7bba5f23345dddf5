"""Offline installs: a folder holding every wheel (or sdist) a lock installs.

GPU cluster nodes often have no internet. `reprobox wheelhouse` downloads, on a machine that
has it, each distribution a lock pins, for the target's Python and platform tag; with
`REPROBOX_WHEELHOUSE=DIR` installs then read only that folder (`--no-index --find-links`).
uv has no `pip download`, so pip downloads, one pinned entry at a time (`--no-deps`: the lock
is already the full set), with the lock's hashes checked (a uv lock hashes every file of a
version, so they hold for another target Python too). Several locks (variants, repros) fill
one folder: each pin is downloaded once. For a host that brings its own torch
(`torch_from_host`), torch's family and what only it needs are left out by the host-torch lock
flavour's own rule (`host_entries.without_host_torch`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reprobox.core.errors import BadInput, EnvError
from reprobox.core.settings import Settings
from reprobox.envs import torch_source
from reprobox.envs.host_entries import without_host_torch

DEFAULT_TAG = "manylinux_2_28_x86_64"  # what the locks target (locks.PLATFORM_TAGS)


@dataclass(frozen=True)
class Wheelhouse:
    """What a download left in the folder."""

    path: Path
    files: tuple[str, ...]
    bytes: int
    hashes_checked: bool
    left_out: tuple[str, ...] = ()  # pins the host provides (torch's family), not downloaded
    unchecked: tuple[str, ...] = ()  # pins downloaded without a hash check (see `download`)

    def largest(self, n: int = 5) -> list[tuple[str, int]]:
        """The `n` largest files and their sizes in bytes: what to drop if it is too big."""
        sizes = [(name, (self.path / name).stat().st_size) for name in self.files]
        return sorted(sizes, key=lambda item: -item[1])[:n]


def lock_entries(lock_text: str) -> list[str]:
    """Each pinned distribution's block of a hashed lock (its line and its `--hash` lines)."""
    entries: list[str] = []
    for line in lock_text.splitlines(keepends=True):
        if line[:1] in ("", "#", "\n"):
            continue
        if line[:1] == " ":
            if entries and line.lstrip().startswith("--hash"):
                entries[-1] += line
            continue
        entries.append(line)
    return [entry.rstrip(" \\\n") if "--hash" not in entry else entry for entry in entries]


def pip_platforms(tag: str) -> list[str]:
    """The tags pip should accept for `tag`: pip does not widen `manylinux_2_28_x86_64` to the
    older manylinux wheels a host of that glibc also runs (most of PyPI's)."""
    prefix, _, arch = tag.partition("_2_")
    if prefix != "manylinux" or "_" not in arch:
        return [tag]
    minor, _, machine = arch.partition("_")
    if not minor.isdigit():
        return [tag]
    tags = [f"manylinux_2_{n}_{machine}" for n in range(int(minor), 4, -1)]
    return [*tags, f"manylinux2014_{machine}", f"manylinux2010_{machine}",
            f"manylinux1_{machine}", f"linux_{machine}"]  # fmt: skip


def pip_command() -> list[str]:
    """pip, as a command this process can run (a dependency of reprobox, so its own
    interpreter has it)."""
    for pip in ([sys.executable, "-m", "pip"], ["python3", "-m", "pip"]):
        try:
            ok = subprocess.run([*pip, "--version"], capture_output=True, timeout=60).returncode
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok == 0:
            return pip
    raise EnvError("pip is not available to download a wheelhouse (python -m pip)")


def entry_pin(entry: str) -> str:
    """The entry without its hashes (`numpy==1.26.4`): what two locks share."""
    return entry.split("\\", 1)[0].strip()


def wanted_entries(
    locks: Sequence[Path],
    *,
    torch_from_host: bool,
    host_packages: Mapping[Path, Sequence[str]] | None = None,
) -> tuple[list[str], list[str]]:
    """The entries of every lock, each pin once, and the pins left out because the host
    gives them (with `torch_from_host`, by the host flavour's own rule: torch's family, and
    each lock's platform's `host_packages`)."""
    wanted: dict[str, str] = {}
    left_out: dict[str, None] = {}
    for lock in locks:
        text = lock.read_text()
        also = (host_packages or {}).get(lock, ())
        kept, _ = without_host_torch(text, also) if torch_from_host else (text, [])
        pins = {entry_pin(entry) for entry in lock_entries(kept)}
        for entry in lock_entries(text):
            if entry_pin(entry) in pins:
                wanted.setdefault(entry_pin(entry), entry)
            else:
                left_out[entry_pin(entry)] = None
    return list(wanted.values()), list(left_out)


def _fetch(base: list[str], scratch: Path, requirement: str) -> str | None:
    """Download one requirement as a wheel, else as its sdist: None, or pip's last word."""
    req = scratch / "entry.txt"
    req.write_text(requirement if requirement.endswith("\n") else requirement + "\n")
    failed = ""
    for kind in ("--only-binary=:all:", "--no-binary=:all:"):
        done = subprocess.run([*base, kind, "-r", str(req)], capture_output=True, text=True,
                              check=False)  # fmt: skip
        if done.returncode == 0:
            return None
        failed = failed or ((done.stderr.strip().splitlines() or ["no message"])[-1])
    return failed


def download(
    locks: Sequence[Path],
    dest: Path,
    *,
    python: str,
    lock_python: str,
    tag: str,
    settings: Settings,
    torch_from_host: bool = False,
    host_packages: Mapping[Path, Sequence[str]] | None = None,
) -> Wheelhouse:
    """Download every distribution `locks` pin into `dest` for `python` and `tag`, each once.

    A wheel is preferred; a distribution without one for the target (deepspeed is an sdist)
    is downloaded as its sdist. The lock's hashes are checked: a uv lock hashes every file of
    a version (each Python's wheels), so another Python's files match too. Only for another
    Python than the lock's, a pin whose file the lock has no hash of (a wheel found in a
    local folder at lock time) is downloaded unchecked, and named (`unchecked`). With
    `torch_from_host`, torch's family is not downloaded (the host's torch is used), nor a
    lock's `host_packages` (per lock)."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = pip_command()
    links = [a for link in torch_source.find_links(settings) for a in ("--find-links", link)]
    target = [f"--platform={p}" for p in pip_platforms(tag)]
    target += ["--python-version", python, "--implementation", "cp"]
    base = [*pip, "download", "--no-deps", "--quiet", "--dest", str(dest), *links, *target]
    entries, left_out = wanted_entries(
        locks, torch_from_host=torch_from_host, host_packages=host_packages
    )
    unchecked: list[str] = []
    with tempfile.TemporaryDirectory(prefix="reprobox-wheelhouse-") as scratch:
        for entry in entries:
            why = _fetch(base, Path(scratch), entry)
            if why is not None and python != lock_python:
                why = _fetch(base, Path(scratch), entry_pin(entry))
                unchecked += [entry_pin(entry)] if why is None else []
            if why is not None:
                raise EnvError(
                    f"cannot download {entry_pin(entry)} for Python {python}, {tag}: {why}"
                )
    files = tuple(sorted(p.name for p in dest.iterdir() if p.is_file()))
    size = sum((dest / f).stat().st_size for f in files)
    return Wheelhouse(dest, files, size, not unchecked, tuple(left_out), tuple(unchecked))


def sdists(house: Wheelhouse) -> list[str]:
    """The files that are sources, not wheels: each is built on the target at install (a
    compiler, or Rust, may be needed there)."""
    return [name for name in house.files if not name.endswith(".whl")]


def install_args(settings: Settings) -> list[str]:
    """uv arguments that confine an install (and a resolution) to the wheelhouse, if one is
    set (`REPROBOX_WHEELHOUSE`): no index is asked."""
    if settings.wheelhouse is None:
        return []
    if not settings.wheelhouse.is_dir():
        raise BadInput(f"REPROBOX_WHEELHOUSE={settings.wheelhouse}: no such folder")
    return ["--no-index", "--find-links", str(settings.wheelhouse)]
