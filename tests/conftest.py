"""Shared fixtures: the real checkout, a scratch checkout holding the toy repro, and a way
to run the `reprobox` command as a user would (a subprocess, exit code and all)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import write_repro as write_repro  # its old home: older imports keep working

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def scratch_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty checkout (repros/, fixes/) that the harness treats as the repo root."""
    root = tmp_path / "checkout"
    (root / "repros").mkdir(parents=True)
    (root / "fixes").mkdir()
    (root / "noxfile.py").write_text("")
    monkeypatch.setenv("REPROBOX_ROOT", str(root))
    monkeypatch.setenv("REPROBOX_RESULTS", str(root / "results"))
    return root


@pytest.fixture
def toy_root(scratch_root: Path) -> Path:
    """A checkout holding the toy repro of tests/fixtures."""
    shutil.copytree(FIXTURES / "repros" / "toy", scratch_root / "repros" / "toy")
    shutil.copy(FIXTURES / "fixes" / "toy_fix.py", scratch_root / "fixes")
    return scratch_root


def reprobox(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess, in the (possibly monkeypatched) environment."""
    return subprocess.run(
        [sys.executable, "-m", "reprobox", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def newest_records(results: Path, repro: str) -> dict[str, dict]:
    """The newest record of every cell of `repro` under `results`, by cell label."""
    found = {}
    for path in sorted((results / repro).glob("*/*/record.json")):
        record = json.loads(path.read_text())
        found[record["label"]] = record
    return found
