"""What pip is configured with here, read at run time (never written into the repo).

uv does not read pip's configuration, so the harness asks pip for the setting it honours:
local wheel folders (`find-links`, e.g. a CPU torch wheel on disk).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path


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


@functools.cache
def find_links() -> tuple[str, ...]:
    """Existing local folders from REPROBOX_FIND_LINKS, PIP_FIND_LINKS and pip's config."""
    links: list[str] = []
    for value in (os.environ.get("REPROBOX_FIND_LINKS", ""), os.environ.get("PIP_FIND_LINKS", "")):
        links += value.split()
    for key, value in pip_config().items():
        if key.endswith("find-links"):
            links += value.split()
    return tuple(link for link in dict.fromkeys(links) if Path(link).is_dir())
