"""The nox surface (sessions, call specs) and committed locks that agree with repro.toml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import reprobox
from reprobox.core import spec
from reprobox.envs import locks
from reprobox.run import pipeline as workflow


def _nox(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nox", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_cells_are_listed_with_call_specs(root: Path) -> None:
    listed = _nox("--json", "-l", "-t", "default", "matrix", cwd=root)
    assert listed.returncode == 0, listed.stderr
    sessions = json.loads(listed.stdout)
    names = {s["session"] for s in sessions}
    assert "repro_lm_head(default)" in names
    assert "repro_lm_head(variant='broken', transformers='5.24.0', model='t5')" in names
    spec_of = {s["session"]: s["call_spec"] for s in sessions}
    assert spec_of["repro_lm_head(variant='broken', transformers='5.24.0', model='t5')"] == {
        "repro": "lm_head", "variant": "broken", "transformers": "5.24.0", "model": "t5",
    }  # fmt: skip
    default = next(s for s in sessions if s["session"] == "repro_lm_head(default)")
    assert default["tags"] == ["default"]


def test_committed_locks_agree_with_repro_toml(root: Path) -> None:
    """Fails loudly when someone edits pins without `nox -s lock`."""
    done = reprobox("lock", "--check")
    assert done.returncode == 0, done.stderr
    for name in spec.discover(root):
        repro = spec.load(root, name)
        for variant in repro.variants_on("cpu"):
            lock = workflow.lock_path(repro, variant, "cpu")
            request = workflow.lock_request(repro, variant, "cpu")
            assert locks.lock_input_hash(lock) == request.input_hash, lock
            assert "--hash=sha256:" in lock.read_text()
