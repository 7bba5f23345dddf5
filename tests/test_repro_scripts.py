"""The repro scripts' own "cannot test" and error paths, without an environment.

A script says "cannot test" (125) only for a known condition it can name; anything else is an
error with its own code (3), never 1, which `git bisect run` would read as "reproduced".
The scripts are loaded by path (a repro never imports the harness; a test may import a repro).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT

PROTOCOL_CODES = {0, 1, 125}


def load_script(path: Path) -> ModuleType:
    """A repro script as a module (its `if __name__ == "__main__"` part does not run)."""
    spec = importlib.util.spec_from_file_location(f"repro_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


average = load_script(ROOT / "repros" / "lm_head" / "average.py")


def test_avg_op_cannot_test_only_for_gloo_refusing_avg() -> None:
    """gloo before pytorch PR #149781 raises exactly this (measured on torch 2.1.2)."""
    refusal = RuntimeError("Cannot use ReduceOp.AVG with Gloo\nException raised from ...")
    assert "Cannot use ReduceOp.AVG with Gloo" in average.avg_refusal(refusal, "gloo")


@pytest.mark.parametrize(
    ("exc", "backend"),
    [(RuntimeError("Connection closed by peer [127.0.0.1]:29500"), "gloo"),
     (ValueError("Cannot use ReduceOp.AVG with Gloo"), "gloo"),  # not what gloo raises
     (RuntimeError("Cannot use ReduceOp.AVG with Gloo"), "nccl"),  # not gloo at all
     (RuntimeError("NCCL error: unhandled cuda error"), "nccl")],
    ids=["peer-died", "valueerror", "nccl-backend", "nccl-error"],
)  # fmt: skip
def test_avg_op_any_other_failure_is_an_error(exc: BaseException, backend: str) -> None:
    assert average.avg_refusal(exc, backend) is None


@pytest.mark.parametrize("script", ["lm_head/average.py", "shuffle_seed/shuffle_seed.py"])
def test_a_script_that_fails_exits_with_an_error_code(script: str, tmp_path: Path) -> None:
    """A broken install (a torch that raises on import) ends in the script's error code after
    its traceback, not in 1 (reproduced) nor in 125 (cannot test)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise RuntimeError('torch broken on purpose')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "repros" / script), "--variant", "probe"],
        env={**env, "PYTHONPATH": str(tmp_path), "REPRO_RESULT": str(tmp_path / "result.json")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert done.returncode not in PROTOCOL_CODES
    assert done.stderr.strip().splitlines()[-1] == "RuntimeError: torch broken on purpose"
    assert not (tmp_path / "result.json").exists()  # no verdict written for an error
