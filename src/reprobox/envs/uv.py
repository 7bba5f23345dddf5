"""The pinned uv: where its binary is, how it is run, and its errors as one line.

Every uv call of the harness goes through `run_uv`, so a failure always ends as one sentence
with the full log kept under the cache.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from reprobox.core import env_filter
from reprobox.core.errors import BadInput, EnvError, ExitCode
from reprobox.core.settings import Settings
from reprobox.envs import torch_source


def uv_bin() -> str:
    """The pinned uv that ships with the harness (the `uv` wheel), else one on PATH."""
    try:
        from uv import find_uv_bin  # optional: the pinned uv wheel, else a uv on PATH

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise EnvError("uv is not installed; run `make` targets, which install it") from None
        return found


@functools.cache
def index_url() -> str:
    """The index uv resolves against (its default, or the UV_* settings), as uv reports it:
    release lists must come from where the locks come from, and no address is written here."""
    proc = subprocess.run(
        [uv_bin(), "pip", "compile", "-", "--emit-index-url", "--no-header", "--quiet"],
        input="", capture_output=True, text=True, timeout=120, env=env_filter.for_uv(os.environ),
    )  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("--index-url "):
            return line.split(None, 1)[1].strip().rstrip("/")
    raise EnvError(f"cannot tell which index uv uses: {summarize_uv_error(proc.stderr)}")


_NO_VERSION = re.compile(r"there is no version of ([^\s,]+)")


def run_uv(
    cmd: list[str],
    *,
    what: str,
    settings: Settings,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run uv; a failure is one error whose message names uv's own (the full log is kept
    under the cache). A tampered or corrupt download is an integrity error, never a skip."""
    proc = subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        env={**env_filter.for_uv(os.environ), **(env or {})},  # never the harness's secrets
        check=False,
    )
    if proc.returncode == 0:
        return proc
    log = settings.cache / "logs" / f"uv-{what.replace(' ', '-')}-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    summary = summarize_uv_error(proc.stderr)
    missing = _NO_VERSION.search(proc.stderr)
    if missing:
        wanted = missing.group(1)
        if _is_torch(wanted):  # the pinned build is not on any source this machine names
            source = torch_source.from_settings(settings)
            raise BadInput(
                f"cannot {what}: no such version: {wanted} (tried: {source.tried()}); "
                f"{source.hint()} (uv log: {log})"
            )
        raise BadInput(f"cannot {what}: no such version: {wanted} (uv log: {log})")
    if "hash mismatch" in proc.stderr.lower():
        raise EnvError(
            f"cannot {what}: a hash in the lock does not match what was downloaded: {summary} "
            f"(uv log: {log})",
            exit_code=ExitCode.INTEGRITY,
        )
    raise EnvError(f"cannot {what}: {summary} (uv log: {log})")


def _is_torch(requirement: str) -> bool:
    try:
        return canonicalize_name(Requirement(requirement).name) == "torch"
    except InvalidRequirement:
        return False


def summarize_uv_error(stderr: str) -> str:
    """uv's error as one line: its first `error:` line and the first cause."""
    lines = [line.strip(" ×╰─▶│") for line in stderr.splitlines()]
    lines = [line.strip() for line in lines if line.strip()]
    head = next((line for line in lines if line.startswith("error:")), lines[0] if lines else "")
    cause = next((line for line in lines if line.startswith(("cause:", "Because", "hint:"))), "")
    text = f"{head.removeprefix('error:').strip()}" + (f"; {cause}" if cause else "")
    return text[:400] or "uv failed without a message"
