"""The lm_head repro end to end: real 4-rank gloo runs, both ways, and the matrix."""

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


def test_default_variants_prove_the_bug_both_ways(results: Path) -> None:
    done = reprobox("run", "lm_head")
    assert done.returncode == ExitCode.OK, done.stderr
    records = newest_records(results, "lm_head")
    assert set(records) == {"broken", "fixed", "avg_op", "untied"}

    broken = records["broken"]["metrics"]
    assert records["broken"]["verdict"] == "reproduced"
    assert broken["lm_head_over_mean"] == pytest.approx(4.0, rel=1e-5)  # world_size x mean
    assert broken["predicted_lm_head_factor"] == 4.0
    # The trap from the report: after loading, lm_head == wte, and both are 4x the mean.
    assert broken["loaded_lm_head_equals_wte"] == 1.0
    assert broken["loaded_wte_over_mean"] == pytest.approx(4.0, rel=1e-5)

    fixed = records["fixed"]["metrics"]
    assert records["fixed"]["verdict"] == "clean"
    assert fixed["lm_head_over_mean"] == pytest.approx(1.0, rel=1e-6)
    assert fixed["lm_head_allclose_violation"] <= 0
    assert fixed["loaded_lm_head_equals_wte"] == 1.0  # the fix keeps the tie

    assert records["avg_op"]["verdict"] in ("clean", "cannot_test")
    assert records["untied"]["verdict"] == "clean"
    assert records["untied"]["metrics"]["aliased_keys"] == 0

    result = records["broken"]["result"]
    assert result["world_size"] == 4 and result["backend"] == "gloo"
    assert result["versions"]["transformers"] == "4.32.1"
    assert len(result["ranks"]) == 4


@pytest.mark.slow
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
