"""Metric values that explain themselves in the results table: a count with its total
(`3 of 3`), an excess over a tolerance that is 0 (`within tolerance`), and records written
before a metric was renamed still render (the rule's metric said to be not recorded).
The repros are the real ones (their repro.toml), the records fake."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reprobox.core.records import Record, RecordStore
from reprobox.report import build as report
from reprobox.report.data import key_metrics
from reprobox.report.metric_text import shown

ROOT = Path(__file__).resolve().parents[1]
NO_ENV = report.ReportOptions(collect_env=False)


@pytest.mark.parametrize(
    ("metrics", "name", "text"),
    [
        ({"same_order_pairs": 3.0, "same_order_pairs_of": 3.0}, "same_order_pairs", "3 of 3"),
        ({"same_order_pairs": 0.0, "same_order_pairs_of": 3.0}, "same_order_pairs", "0 of 3"),
        ({"x": 0.5, "x_of": 3.0}, "x", "0.5"),  # not a count: the number
        ({"a_excess_over_tolerance": 0.0}, "a_excess_over_tolerance", "within tolerance"),
        ({"a_excess_over_tolerance": 6.4931}, "a_excess_over_tolerance", "6.493"),
        ({"other": 1.0}, "missing", "not recorded"),
        ({}, "missing", ""),  # no metrics at all: the cell did not run
    ],
)
def test_shown(metrics: dict[str, float], name: str, text: str) -> None:
    assert shown(metrics, name) == text


def _repro(root: Path, name: str) -> None:
    shutil.copytree(ROOT / "repros" / name, root / "repros" / name)
    if name == "lm_head":
        shutil.copy(ROOT / "fixes" / "tied_average.py", root / "fixes")


def _save(root: Path, repro: str, variant: str, verdict: str, metrics: dict[str, float]) -> None:
    store = RecordStore(root / "results")
    run_dir = store.new_run_dir(repro, f"cpu-{variant}")
    expect = "reproduced" if variant == "broken" else "clean"
    Record(
        repro=repro, variant=variant, label=variant, packages={}, params={}, expect=expect,
        also_ok=[], status="match" if verdict == expect else "mismatch", verdict=verdict,
        reason="", exit_code=1 if verdict == "reproduced" else 0, metrics=metrics,
        result={"schema": 1, "verdict": verdict, "metrics": metrics, "versions": {},
                "device": "cpu", "world_size": 2},
        command=[], wall_s=1.0, started_at="2026-12-01T00:00:00Z", dir=str(run_dir),
    ).save()  # fmt: skip


def _results_table(comment: str) -> str:
    return comment.split("### Results\n\n", 1)[1].split("\n\n", 1)[0]


def test_a_count_reads_n_of_total(scratch_root: Path) -> None:
    _repro(scratch_root, "shuffle_seed")
    for variant, same, distinct in (("broken", 3.0, 1.0), ("fixed", 0.0, 3.0)):
        metrics = {
            "same_order_pairs": same, "same_order_pairs_of": 3.0,
            "distinct_orders": distinct, "distinct_orders_of": 3.0, "seeds": 3.0,
        }  # fmt: skip
        _save(scratch_root, "shuffle_seed", variant, "reproduced" if same else "clean", metrics)
    comment = report.write_report(scratch_root, "shuffle_seed", NO_ENV).comment.read_text()
    table = _results_table(comment)
    assert table.splitlines()[0] == "| variant | verdict | `same_order_pairs` | `distinct_orders` |"
    assert "| `broken` | ✅ reproduced | 3 of 3 | 1 of 3 |" in table
    assert "| `fixed` | ✅ clean | 0 of 3 | 3 of 3 |" in table
    assert "_of" not in table  # a total is never a column of its own
    assert "Reproduced when `same_order_pairs` > 0" in comment


def test_a_clean_excess_reads_within_tolerance(scratch_root: Path) -> None:
    _repro(scratch_root, "lm_head")
    for variant, excess, factor in (("broken", 6.4931, 4.0), ("fixed", 0.0, 1.0)):
        metrics = {"lm_head_excess_over_tolerance": excess, "lm_head_over_mean": factor}
        _save(scratch_root, "lm_head", variant, "reproduced" if excess else "clean", metrics)
    made = report.write_report(scratch_root, "lm_head", NO_ENV)
    table = _results_table(made.comment.read_text())
    assert "| `broken` | ✅ reproduced | 6.493 | 4 |" in table
    assert "| `fixed` | ✅ clean | within tolerance | 1 |" in table
    assert "-" not in table.split("\n", 2)[2]  # no negative number anywhere
    assert sorted(p.name for p in made.plots)[0] == "metric_lm_head_excess_over_tolerance.png"


def test_an_old_record_still_renders(scratch_root: Path) -> None:
    """Records from before the renames (a fraction, a negative violation) still make a
    report; the rule's metric, which they lack, is said to be not recorded."""
    _repro(scratch_root, "lm_head")
    _save(scratch_root, "lm_head", "broken", "reproduced",
          {"lm_head_allclose_violation": 6.4931, "lm_head_over_mean": 4.0})  # fmt: skip
    _save(scratch_root, "lm_head", "fixed", "clean",
          {"lm_head_allclose_violation": -1.172e-08, "lm_head_over_mean": 1.0})  # fmt: skip
    comment = report.write_report(scratch_root, "lm_head", NO_ENV).comment.read_text()
    table = _results_table(comment)
    assert "| `broken` | ✅ reproduced | not recorded | " in table
    assert "| `fixed` | ✅ clean | not recorded | " in table


def test_a_total_is_no_headline_metric() -> None:
    records = [
        Record(repro="r", variant=v, label=v, packages={}, params={}, expect=v, also_ok=[],
               status="match", verdict=v, reason="", exit_code=0,
               metrics={"hits": n, "hits_of": t, "other": n}, result={}, command=[],
               wall_s=1.0, started_at="", dir="")
        for v, n, t in (("reproduced", 3.0, 3.0), ("clean", 0.0, 4.0))
    ]  # fmt: skip
    assert key_metrics(records, ["hits"]) == ["hits", "other"]
