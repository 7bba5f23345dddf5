"""Where torch comes from: the settings that name a source of its CPU build, read at run time.

Every committed CPU lock pins the CPU build of torch (`torch==X+cpu`), which the default index
does not serve. A machine names a source of it in one of these ways, all read at run time and
never written into the repo:

- `REPROBOX_TORCH_INDEX`: a PEP 503 simple index such as the PyTorch CPU index
  (`https://download.pytorch.org/whl/cpu`); only torch is taken from it (its `torch/` page is
  handed to uv as a flat link page), every other package still comes from the default index;
- local wheel folders: pip's `find-links` (uv does not read pip's configuration, so the
  harness asks pip), `PIP_FIND_LINKS`, `REPROBOX_FIND_LINKS`;
- uv's own `UV_EXTRA_INDEX_URL`, `UV_INDEX_URL`, `UV_FIND_LINKS` (uv reads them itself; they
  are named here so a record and an error can say they were used).

Where none can serve it, `REPROBOX_TORCH_SOURCE=pypi` takes the
default index's build instead (the CUDA build, which runs on CPU): a lock flavour resolved
into the cache, never committed (see `locks.LockRequest.torch_source`).

`REPROBOX_TORCH_SOURCE=host` takes no torch from any index: GPU clusters (NGC-style images,
site installs) bring their own CUDA build, found with `REPROBOX_HOST_PYTHON` (default
`python3` on PATH) and probed here (`probe_host`); the venv is made with that interpreter and
sees that torch (`venvs`), and the lock is installed without torch and its CUDA runtime
wheels (`locks.host_lock`).
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from reprobox.core.errors import EnvError
from reprobox.core.processes import signal_group
from reprobox.core.settings import Settings

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What the pypi flavour of lm_head's lock downloads on Linux x86-64, python 3.11 (the default
# index's file sizes: torch 2.13.0, triton and the nvidia-* CUDA libraries it requires), against
# about 0.25 GB for the CPU build's lock.
PYPI_FLAVOUR_SIZE = "about 2.8 GB to download, torch 527 MB of it"


def _pip_commands() -> list[list[str]]:
    """pip as a command, from the first source that has one (a uv venv has no pip)."""
    candidates = [[sys.executable, "-m", "pip"], ["python3", "-m", "pip"]]
    if pip := shutil.which("pip3") or shutil.which("pip"):
        candidates.insert(0, [pip])
    return candidates


def _ask_pip(*args: str) -> str:
    for pip in _pip_commands():
        try:
            proc = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return proc.stdout
    return ""


@functools.cache
def pip_config() -> dict[str, str]:
    """`pip config list` as {key: value}, e.g. {"global.find-links": "/some/dir"}."""
    config = {}
    for line in _ask_pip("config", "list").splitlines():
        key, found, value = line.partition("=")
        if found:
            config[key.strip()] = value.strip().strip("'\"")
    return config


def find_links(settings: Settings) -> tuple[str, ...]:
    """Existing local folders from REPROBOX_FIND_LINKS, PIP_FIND_LINKS and pip's config."""
    links = [*settings.find_links]
    for key, value in pip_config().items():
        if key.endswith("find-links"):
            links += value.split()
    return tuple(link for link in dict.fromkeys(links) if Path(link).is_dir())


def pinned_torch(lock_text: str) -> Version | None:
    """The torch version a lock pins, if it pins one (`+cpu`: the CPU build)."""
    for line in lock_text.splitlines():
        name, sep, version = line.partition("==")
        if sep and canonicalize_name(name.strip()) == "torch":
            try:
                return Version(version.split()[0].rstrip("\\"))
            except (InvalidVersion, IndexError):
                return None
    return None


@dataclass(frozen=True)
class TorchSource:
    """The torch sources of this process: what uv is given, and how to say so."""

    # cpu: the CPU build, from the sources below | pypi: the default's | host: the host's own
    flavour: str = "cpu"
    folders: tuple[str, ...] = ()  # local wheel folders (find-links)
    index: str | None = None  # REPROBOX_TORCH_INDEX, a simple index's root
    uv_settings: tuple[tuple[str, str], ...] = ()  # (name, value) of UV_* set in the env

    @property
    def index_page(self) -> str | None:
        """The index's torch page (PEP 503 `<root>/torch/`), a flat link page for uv."""
        return f"{self.index.rstrip('/')}/torch/" if self.index else None

    def uv_args(self) -> list[str]:
        """Arguments for every uv compile and install (the pypi and host flavours add none)."""
        if self.flavour in ("pypi", "host"):
            return []
        pages = [*self.folders, *([self.index_page] if self.index_page else [])]
        return [arg for page in pages for arg in ("--find-links", page)]

    @property
    def configured(self) -> bool:
        """Whether anything besides the default index can serve torch."""
        return bool(self.folders or self.index or self.uv_settings)

    def describe(self) -> str:
        """What was used, short and without local paths (records are shared upstream)."""
        if self.flavour == "pypi":
            return "pypi (the default index's torch build)"
        if self.flavour == "host":
            return "host (REPROBOX_HOST_PYTHON's own torch)"
        parts = []
        if self.index:
            parts.append(f"index {self.index}")
        if self.folders:
            n = len(self.folders)
            parts.append(f"find-links ({n} local folder{'s' if n > 1 else ''})")
        for name, value in self.uv_settings:
            shown = value if "://" in value and not value.startswith("file:") else "local"
            parts.append(f"{name} {shown}")
        return "; ".join(parts) or "default index only"

    def tried(self) -> str:
        """The sources an install looked in, for an error message."""
        used = self.describe()
        return used if used.startswith("default") else f"{used}; the default index"

    def hint(self) -> str:
        """How to add a source of the CPU build, in one sentence."""
        return (
            f"add one: REPROBOX_TORCH_INDEX={PYTORCH_CPU_INDEX} (or UV_FIND_LINKS=<a folder "
            "holding the wheel>), or take the default index's CUDA build with "
            f"REPROBOX_TORCH_SOURCE=pypi ({PYPI_FLAVOUR_SIZE})"
        )


def from_settings(settings: Settings) -> TorchSource:
    """The torch sources these settings name."""
    return TorchSource(
        flavour=settings.torch_source,
        folders=find_links(settings),
        index=settings.torch_index,
        uv_settings=settings.uv_settings,
    )


# ---- the host's torch (REPROBOX_TORCH_SOURCE=host) ------------------------------------------

# Run by the host interpreter: what it is, and the torch it imports (a real import: a torch
# that does not import is found here, not as a traceback in every rank).
_PROBE = """
import json, sys
out = {"python": "%d.%d" % sys.version_info[:2], "executable": sys.executable}
try:
    import torch
    out.update(version=str(torch.__version__), cuda=torch.version.cuda, file=torch.__file__)
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    import importlib.metadata as md
    eps = md.distribution("torch").entry_points
    out["scripts"] = [[e.name, e.value] for e in eps if e.group == "console_scripts"]
except Exception:
    out["scripts"] = []
import os, sysconfig
own = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
out["paths"] = [  # where the host finds packages (site dirs, PYTHONPATH), not its stdlib
    p for p in sys.path[1:]
    if p and os.path.isdir(p) and p not in own and os.path.basename(p) != "lib-dynload"
]
out["packages"] = {}
for name in sys.argv[1:]:  # more packages the repro takes from the host: version, folder
    try:
        dist = md.distribution(name)
        out["packages"][name] = [dist.version, str(dist.locate_file(""))]
    except md.PackageNotFoundError:  # absent: cannot test; anything else fails the probe
        out["packages"][name] = None
print("REPROBOX-HOST " + json.dumps(out))
"""
PROBE_TIMEOUT = 300.0  # importing a CUDA torch from a network file system can take a while


@dataclass(frozen=True)
class HostTorch:
    """The host's torch as its interpreter imports it: what a host venv is made from."""

    python: str  # the interpreter (an absolute path; a host venv is made with it)
    python_version: str  # its X.Y
    version: str  # torch.__version__
    cuda: str | None  # torch.version.cuda (None: a CPU or ROCm build)
    site: str  # the folder holding the `torch` package (what the host venv's .pth names)
    # torch's commands (name, "module:function"), which live in the host's bin, not the venv's
    scripts: tuple[tuple[str, str], ...] = (("torchrun", "torch.distributed.run:main"),)
    # the repro's `host_packages` as the host has them: (name, version, folder holding it)
    packages: tuple[tuple[str, str, str], ...] = ()
    missing: tuple[str, ...] = ()  # those the host does not have
    # the host's other package folders (its site-packages, PYTHONPATH): where torch's own
    # dependencies live, which the host flavour leaves out of the lock
    paths: tuple[str, ...] = ()

    @property
    def identity(self) -> dict[str, object]:
        """What a host venv was built against; a change means the venv no longer matches."""
        found: dict[str, object] = {"python": self.python, "version": self.version}
        found["site"] = self.site
        if self.packages:
            found["packages"] = {name: [version, site] for name, version, site in self.packages}
        if self.paths:
            found["paths"] = list(self.paths)
        return found

    @property
    def sites(self) -> list[str]:
        """The folders a host venv's `.pth` names: torch's, its other packages', then the
        rest of the host's (what torch itself imports: the host flavour drops what only
        torch needs); all after the venv's own site-packages, so the lock's pins win."""
        packages = (site for _, _, site in self.packages)
        return list(dict.fromkeys([self.site, *packages, *self.paths]))

    def record(self, lock_python: str) -> dict[str, str]:
        """The record's `host_torch`: version, CUDA, where it lives, and the interpreter
        (with the lock's python where the two differ: allowed, but worth a word)."""
        fields = {
            "version": self.version,
            "cuda": self.cuda or "none",
            "path": self.site,
            "python": self.python,
            "python_version": self.python_version,
        }
        if self.python_version != lock_python:
            fields["lock_python"] = lock_python
        for name, version, site in self.packages:
            fields[f"package {name}"] = f"{version} at {site}"
        if self.paths:
            fields["paths"] = ":".join(self.paths)  # the host's folders the venv also sees
        return fields

    def describe(self, lock_python: str | None = None) -> str:
        """One line for the record's torch_source and the report, without local paths."""
        cuda = f"CUDA {self.cuda}" if self.cuda else "no CUDA"
        line = f"host: torch {self.version} ({cuda}), python {self.python_version}"
        line += "".join(f", {name} {version}" for name, version, _ in self.packages)
        if lock_python and lock_python != self.python_version:
            line += f" (the lock's python is {lock_python})"
        return line


def run_import(
    argv: list[str], what: str, timeout: float | None, cwd: str | Path
) -> subprocess.CompletedProcess[str]:
    """Run a python that imports torch (the host probe, a host venv's check), waiting at
    most `timeout` seconds (the run's --timeout; None: PROBE_TIMEOUT), in its own session:
    one that outlives it is killed with everything it started, and is an environment error."""
    limit = timeout or PROBE_TIMEOUT
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, cwd=cwd, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=limit)
    except BaseException as exc:
        signal_group(proc, signal.SIGKILL)  # not once it is reaped: its id may be another's
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise EnvError(f"{what}: importing torch took over {limit:g} s") from None
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@functools.cache
def probe_host(
    python: str, packages: tuple[str, ...] = (), timeout: float | None = None
) -> HostTorch:
    """The host's torch, as `python` (REPROBOX_HOST_PYTHON: a name on PATH or a path) imports
    it, and where the host has `packages` (a repro's `host_packages`); once per process. An
    interpreter that is not there or does not run, or that has no torch (or one that fails
    to import), is an environment error (exit 3), as is one that takes over `timeout`
    seconds (the run's --timeout) to import it; a package it lacks is in `missing` (the cell
    cannot be tested there: the pipeline says so)."""
    what = f"REPROBOX_HOST_PYTHON={python}"
    found = shutil.which(python) if "/" not in python else python
    if found is None or not Path(found).exists():
        raise EnvError(f"{what}: no such interpreter (not a file, nor a command on PATH)")
    with tempfile.TemporaryDirectory() as cwd:  # a `torch/` folder where we are shadows none
        try:
            proc = run_import([found, "-c", _PROBE, *packages], what, timeout, cwd)
        except OSError as exc:
            raise EnvError(f"{what} does not run: {exc.strerror or exc}") from None
    said = [line for line in proc.stdout.splitlines() if line.startswith("REPROBOX-HOST ")]
    if proc.returncode != 0 or not said:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise EnvError(f"{what} does not run as a python: {last}")
    info = json.loads(said[-1].split(" ", 1)[1])
    if "error" in info:
        raise EnvError(
            f"{what} (python {info['python']}) has no usable torch: {info['error']}; "
            "name an interpreter that imports torch, or unset REPROBOX_TORCH_SOURCE"
        )
    torch_init = Path(info["file"])
    scripts = {name: value for name, value in info.get("scripts") or []}
    scripts.setdefault("torchrun", "torch.distributed.run:main")  # a site build may list none
    return HostTorch(
        python=info["executable"] or found,
        python_version=info["python"],
        version=info["version"],
        cuda=info["cuda"],
        site=str(torch_init.parent.parent),
        scripts=tuple(sorted(scripts.items())),
        packages=tuple(
            (name, got[0], got[1]) for name, got in sorted(info["packages"].items()) if got
        ),
        missing=tuple(sorted(name for name, got in info["packages"].items() if not got)),
        paths=tuple(info.get("paths") or ()),
    )
