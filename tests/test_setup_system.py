"""scripts/setup-system.sh, which `make test` and `make repro` run first: quiet and quick when
everything is there; where it cannot install, one line naming what is missing and the command
that installs it, and a non-zero exit before any test runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "setup-system.sh"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A scratch folder the unprivileged user can read (pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="setup-system-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _bare_path(tmp_path: Path, keep: tuple[str, ...] = ()) -> str:
    """A PATH holding only what the script uses to look around, plus `keep`: no compiler,
    no ninja, no container engine, no sudo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "id", "dirname", *keep):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _as_unprivileged() -> list[str]:
    """Run as an unprivileged user when root (nobody), else as we are."""
    if os.getuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv (util-linux) is needed to run the script as a non-root user")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_missing_pieces_stop_at_once_with_one_line(tmp_path: Path) -> None:
    env = {"PATH": _bare_path(tmp_path)}
    started = time.monotonic()
    done = subprocess.run([*_as_unprivileged(), "bash", str(SCRIPT)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert time.monotonic() - started < 10
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("setup-system: missing g++, ninja, a container engine (podman)")
    assert "apt-get install -y g++ ninja-build" in line and "bash images/setup-podman.sh" in line
    assert "REPROBOX_SKIP_CONTAINERS=1" in line


def test_compilers_only_and_knowingly_without_containers(tmp_path: Path) -> None:
    env = {"PATH": _bare_path(tmp_path), "REPROBOX_SKIP_CONTAINERS": "1"}
    done = subprocess.run([*_as_unprivileged(), "bash", str(SCRIPT), "--no-containers"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "missing g++, ninja;" in done.stderr and "podman" not in done.stderr


def test_present_is_quiet_and_quick(tmp_path: Path) -> None:
    """With the compilers there and containers left out, it only looks."""
    for tool in ("g++", "ninja"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed here: `make test` installs it")
    env = {"PATH": _bare_path(tmp_path, keep=("g++", "ninja"))}
    started = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), "--no-containers"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert time.monotonic() - started < 2


def test_makefile_runs_it_before_anything_else() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "test: system $(STAMP)" in makefile and "repro: system-compilers $(STAMP)" in makefile
    assert "bash scripts/setup-system.sh --no-containers" in makefile
