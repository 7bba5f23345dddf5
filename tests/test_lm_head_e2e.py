"""The lm_head repro end to end: real 4-rank gloo runs of avg_op and of the matrix (its default
variants run in test_repros_e2e.py, with the numbers they must show)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import newest_records, reprobox
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def test_avg_op_still_gives_its_verdict(results: Path) -> None:
    """The narrowed avg_op path end to end: torch 2.13's gloo has ReduceOp.AVG, so the
    reporter's suggested way around is measured (clean), not skipped."""
    done = reprobox("verdict", "lm_head", "--variant", "avg_op")
    assert done.returncode == 0, done.stderr
    [record] = newest_records(results, "lm_head").values()
    assert (record["verdict"], record["status"]) == ("clean", "match")
    assert record["metrics"]["lm_head_over_mean"] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.slow
@pytest.mark.nightly  # see the nightly tier's table in docs/testing.md
def test_matrix_factor_is_world_size_to_the_aliases_minus_one(results: Path) -> None:
    done = reprobox("run", "lm_head", "--matrix")
    assert done.returncode == ExitCode.OK, done.stderr
    records = newest_records(results, "lm_head")
    assert len(records) == 16
    for label, record in records.items():
        metrics = record["metrics"]
        assert metrics["max_factor_prediction_error"] < 1e-4, label
        if label.startswith("broken"):
            assert record["verdict"] == "reproduced", label
        else:
            assert record["verdict"] == "clean", label
    t5 = records["broken[transformers=5.24.0,model=t5]"]["metrics"]
    assert t5["lm_head_over_mean"] == pytest.approx(64.0, rel=1e-5)  # 4 aliases at 4 ranks
    assert (
        records["broken[transformers=5.24.0,model=t5]"]["result"]["versions"]["transformers"]
        == "5.24.0"
    )
