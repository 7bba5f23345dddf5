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


def _fill(folder: Path) -> None:
    """Fill the tmpfs to its last byte."""
    with (folder / "filler").open("ab", buffering=0) as out:
        for size in (4096, 1):
            try:
                while True:
                    out.write(b"x" * size)
            except OSError:
                continue


def test_the_full_disk_message_names_only_what_exists(tiny_results: Path) -> None:
    """A record that cannot be saved says what its run left, as it is on disk: never a
    folder that was not made or a measurement that did not happen (issue 35)."""
    from reprobox.core.errors import ReproboxError
    from reprobox.core.records import Record
    from reprobox.run import pending

    logged = tiny_results / "toy" / "cpu-clean" / "logged"
    logged.mkdir(parents=True)
    (logged / "launch.log").write_text("$ python toy.py\n")
    never = tiny_results / "toy" / "cpu-clean" / "never-made"
    _fill(tiny_results)
    said = {}
    for folder in (logged, never):
        record = Record(repro="toy", variant="clean", label="clean", expect="clean",
                        status="match", verdict="clean", dir=str(folder),
                        started_at="2026-01-01T00:00:00Z")  # fmt: skip
        with pytest.raises(ReproboxError) as raised:
            pending.save(record)
        said[folder.name] = str(raised.value)
    assert said["logged"].startswith("cannot save the record of toy clean: the disk is full; ")
    assert said["logged"].endswith(
        f"no result was written; its logs (launch.log) are kept in {logged}"
    ), said
    assert "measured" not in said["logged"]
    assert said["never-made"].endswith("the disk is full; nothing was measured or logged"), said
    assert not never.exists()  # the folder its save made, empty, is not left behind
