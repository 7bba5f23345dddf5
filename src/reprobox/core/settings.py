"""Process settings: every `REPROBOX_*` variable (and CI) read in one place.

`Settings.from_env()` is called once, at the CLI edge, and the result is passed down; nothing
below the CLI reads the environment for the harness's own settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reprobox.core.errors import BadInput


def default_root(cwd: Path | None = None) -> Path:
    """The checkout holding repros/ and noxfile.py: the working folder or one above it, else
    the checkout this package was installed from."""
    here = (cwd or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "repros").is_dir() and (candidate / "noxfile.py").is_file():
            return candidate
    return Path(__file__).resolve().parents[3]


UV_SETTINGS = ("UV_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_FIND_LINKS")


@dataclass(frozen=True)
class Settings:
    """Where the harness works and how it reaches packages."""

    root: Path
    results: Path
    cache: Path
    find_links: tuple[str, ...] = ()  # REPROBOX_FIND_LINKS / PIP_FIND_LINKS, split
    refresh_index: bool = False  # REPROBOX_REFRESH_INDEX: re-read release lists now
    ca_bundle: Path | None = None  # REPROBOX_CA_BUNDLE: extra CA for image builds
    ci: bool = False  # CI: plain output, no live progress
    # REPROBOX_HEARTBEAT_S: with no live progress, a "still ..." line after this many
    # seconds without output (25: a CI log is never silent for 30 s)
    heartbeat_s: float = 25.0
    torch_index: str | None = None  # REPROBOX_TORCH_INDEX: a simple index serving CPU torch
    # REPROBOX_TORCH_SOURCE: cpu (the CPU build) | pypi (the default index's) | host (the
    # torch of REPROBOX_HOST_PYTHON, a cluster's own CUDA build: envs/torch_source.py)
    torch_source: str = "cpu"
    host_python: str = "python3"  # REPROBOX_HOST_PYTHON: the interpreter with the host's torch
    host_probe_timeout: float | None = None  # the run's --timeout, for the host torch probe
    script_cache: Path | None = None  # REPRO_CACHE: what scripts build (default: under cache)
    # uv's own settings that can serve torch (uv reads them itself; named in records/errors)
    uv_settings: tuple[tuple[str, str], ...] = ()
    wheelhouse: Path | None = None  # REPROBOX_WHEELHOUSE: install from this folder, no index
    # GitHub Actions: this run's page (GITHUB_SERVER_URL/GITHUB_REPOSITORY/GITHUB_RUN_ID),
    # where a report's artifacts are, and the step summary file comment.md is added to
    ci_run_url: str | None = None
    step_summary: Path | None = None  # GITHUB_STEP_SUMMARY
    base_image: str | None = None  # REPROBOX_BASE_IMAGE: what the Dockerfiles build FROM
    engine: str | None = None  # REPROBOX_ENGINE: podman | docker (None: whichever works)
    # REPROBOX_IMAGE_DISK: the disk the harness's images may hold (bytes; a size such as 40g),
    # pruned oldest first after each build; default 40 GiB
    image_disk: int = 40 * 1024**3

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        root = Path(env["REPROBOX_ROOT"]).resolve() if env.get("REPROBOX_ROOT") else default_root()
        results = _absolute(env, "REPROBOX_RESULTS") or root / "results"
        xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        cache = _absolute(env, "REPROBOX_CACHE") or Path(xdg) / "reprobox"
        links = [
            *env.get("REPROBOX_FIND_LINKS", "").split(),
            *env.get("PIP_FIND_LINKS", "").split(),
        ]
        ca = env.get("REPROBOX_CA_BUNDLE")
        return cls(
            root=root,
            results=results,
            cache=cache,
            find_links=tuple(dict.fromkeys(links)),
            refresh_index=bool(env.get("REPROBOX_REFRESH_INDEX")),
            ca_bundle=Path(ca) if ca else None,
            ci=bool(env.get("CI")),
            heartbeat_s=_seconds(env, "REPROBOX_HEARTBEAT_S", 25.0),
            script_cache=_absolute(env, "REPRO_CACHE"),
            uv_settings=tuple((name, env[name]) for name in UV_SETTINGS if env.get(name)),
            torch_index=env.get("REPROBOX_TORCH_INDEX") or None,
            torch_source=_choice(env, "REPROBOX_TORCH_SOURCE", ("cpu", "pypi", "host")),
            host_python=env.get("REPROBOX_HOST_PYTHON") or "python3",
            wheelhouse=_absolute(env, "REPROBOX_WHEELHOUSE"),
            ci_run_url=_ci_run_url(env),
            step_summary=Path(summary) if (summary := env.get("GITHUB_STEP_SUMMARY")) else None,
            base_image=env.get("REPROBOX_BASE_IMAGE") or None,
            engine=_choice(env, "REPROBOX_ENGINE", ENGINES) if env.get("REPROBOX_ENGINE") else None,
            image_disk=_size(env, "REPROBOX_IMAGE_DISK", 40 * 1024**3),
        )


def _ci_run_url(env: Mapping[str, str]) -> str | None:
    """The GitHub Actions run's page, when all three of its parts are set."""
    parts = [env.get(name) for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    if not all(parts):
        return None
    server, repo, run = parts
    return f"{server}/{repo}/actions/runs/{run}"


def _absolute(env: Mapping[str, str], name: str) -> Path | None:
    """A folder setting: unset is None; a relative path is refused (it would change meaning
    with every working folder a launcher, container or bisect step runs in)."""
    value = env.get(name)
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        raise BadInput(f"{name}={value!r} must be an absolute path")
    return path


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds; unset is `default`."""
    value = env.get(name)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise BadInput(f"{name}={value!r} must be a positive number of seconds")
    return seconds


ENGINES = ("podman", "docker")
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _size(env: Mapping[str, str], name: str, default: int) -> int:
    """A size in bytes, written as a whole number with k, m, g or t (binary units); unset
    is `default`."""
    value = env.get(name)
    if not value:
        return default
    text = value.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = text.rstrip("kmgt"), text[len(text.rstrip("kmgt")) :]
    if not number.isdigit() or len(unit) > 1 or int(number) == 0:
        raise BadInput(f"{name}={value!r} must be a size such as 40g or 512m")
    return int(number) * _UNITS[unit]


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    """A setting with a fixed set of values; unset is the first."""
    value = env.get(name) or allowed[0]
    if value not in allowed:
        raise BadInput(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return value


def repro_cache(settings: Settings, repro: str) -> Path:
    """The folder a repro's script keeps what it builds in (a tiny model, JIT-built ops)."""
    return settings.script_cache or settings.cache / "repro-cache" / repro
