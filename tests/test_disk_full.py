"""A results folder that fills up mid-run: the run ends in one line that says the disk is
full, and what was measured (the script's result, the logs) stays on disk. Real: a 64 KiB
tmpfs mounted as the results folder (root, as in CI)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e


@pytest.fixture
def tiny_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (CI runs as root)")
    folder = tmp_path / "tiny"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    monkeypatch.setenv("REPROBOX_RESULTS", str(folder))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_keeps_what_was_measured(toy_root: Path, tiny_results: Path) -> None:
    (tiny_results / "filler").write_bytes(b"x" * (60 * 1024))  # leave only a few KiB free
    done = reprobox("run", "toy", "--variant", "clean")
    errors = [line for line in done.stderr.splitlines() if line.startswith("reprobox: error:")]
    assert done.returncode == ExitCode.HARNESS_FAILED, done.stderr
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert "disk is full" in errors[0] or "No space left" in errors[0], errors[0]
    (tiny_results / "filler").unlink()
    kept = [p.name for p in tiny_results.rglob("*") if p.is_file()]
    # nothing that was written was removed: the run's folder and its logs are there
    assert any(name.endswith(".log") for name in kept), kept
