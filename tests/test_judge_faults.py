"""A crashed rank is never a verdict: every rank's exit status must agree with the result.

Through the real CLI, over the fault repro of tests/fixtures (2 real gloo ranks, plain python
launcher): rank 0 writes a well-formed result, then a rank dies by a real signal or exits with
a code that contradicts it. Each is an error naming the rank and the signal or code (`run`
exits 4, `verdict` exits 255 so that `git bisect run` stops), never the verdict in the file.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, reprobox
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e

BISECT_STOP = 255  # what `reprobox verdict` returns for anything that is neither verdict nor skip


def code(value: int) -> str:
    """A pattern for an exit code standing alone (not part of a path, a number or a name)."""
    return rf"(?<![\w./-]){value}(?![\w./-])"


# (variant, patterns its one error line must hold): the rank and the signal or code
FAULTS = [
    ("segv_rank1", [r"\brank 1\b", r"SIGSEGV|signal 11\b"]),
    ("exit3_rank1", [r"\brank 1\b", code(3)]),
    ("kill_rank0", [r"\brank 0\b", r"SIGKILL|signal 9\b"]),
    ("exit1_said_clean", [r"\brank", code(1), r"\bclean\b"]),
    ("exit0_said_reproduced", [r"\brank", code(0), r"\breproduced\b"]),
]


@pytest.fixture
def fault_root(scratch_root: Path) -> Path:
    """A checkout holding the fault repro (same pins as the toy: the same environment)."""
    shutil.copytree(FIXTURES / "repros" / "fault", scratch_root / "repros" / "fault")
    return scratch_root


def _records(root: Path, variant: str) -> list[dict]:
    paths = sorted((root / "results" / "fault").glob("*/*/record.json"))
    return [r for r in (json.loads(p.read_text()) for p in paths) if r["variant"] == variant]


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("reprobox: error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize(("variant", "patterns"), FAULTS, ids=[v for v, _ in FAULTS])
def test_run_refuses_a_result_its_ranks_contradict(
    fault_root: Path, variant: str, patterns: list[str]
) -> None:
    done = reprobox("run", "fault", "--variant", variant)
    assert done.returncode == ExitCode.RUN_FAILED, (done.returncode, done.stdout, done.stderr)
    line = _one_error_line(done.stderr)
    for pattern in patterns:
        assert re.search(pattern, line), (pattern, line)
    records = _records(fault_root, variant)
    assert [r["status"] for r in records] == ["error"], records


@pytest.mark.parametrize(("variant", "patterns"), FAULTS, ids=[v for v, _ in FAULTS])
def test_verdict_stops_a_bisect_on_a_result_its_ranks_contradict(
    fault_root: Path, variant: str, patterns: list[str]
) -> None:
    done = reprobox("verdict", "fault", "--variant", variant)
    assert done.returncode == BISECT_STOP, (done.returncode, done.stdout, done.stderr)
    line = _one_error_line(done.stderr)
    for pattern in patterns:
        assert re.search(pattern, line), (pattern, line)


def test_a_well_behaved_clean_run_is_clean(fault_root: Path) -> None:
    """The control: the same script, every rank exiting 0 after a clean result."""
    done = reprobox("run", "fault", "--variant", "clean")
    assert done.returncode == ExitCode.OK, done.stderr
    [record] = _records(fault_root, "clean")
    assert (record["status"], record["verdict"]) == ("match", "clean")
    verdict = reprobox("verdict", "fault", "--variant", "clean")
    assert verdict.returncode == 0, verdict.stderr
