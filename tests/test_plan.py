"""`bisect --dry-run`'s plan and the "about N steps left" a running bisect shows: the same
counts (`bisect.plan`), held against what the real driver then probes (fake runs)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bisect_fakes import hist_target, transformers_history, transformers_index

from reprobox.bisect import plan
from reprobox.bisect.releases import release_axis, release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import ProbeEntry


@pytest.mark.parametrize(("gaps", "workers", "steps"),
                         [(1, 1, 0), (2, 1, 1), (7, 1, 3), (8, 1, 3), (9, 1, 4), (8, 3, 2),
                          (16, 3, 2), (17, 3, 3)])  # fmt: skip
def test_a_search_closes_its_gaps_in_ceil_log_steps(gaps: int, workers: int, steps: int) -> None:
    assert plan.search_steps(gaps, workers) == steps


@pytest.mark.parametrize(
    ("good", "bad", "strategy"),
    [("4.46.3", "4.44.2", Strategy()), ("4.46.3", "4.44.2", Strategy(confirm=2, verify=1)),
     ("4.46.0", "4.47.0", Strategy()), ("4.46.0", "4.45.2", Strategy(confirm=0))],
)  # fmt: skip
def test_the_plan_bounds_what_the_bisect_probes_and_steps_count_down_to_zero(
    tmp_path: Path, good: str, bad: str, strategy: Strategy
) -> None:
    target = hist_target(tmp_path)
    _, axis = release_axis(target, "transformers", good, bad, transformers_index())
    found = plan.plan(axis, strategy, "hist", "broken", "cpu")
    assert found.candidates == list(axis.question.names) and found.ends == (good, bad)
    assert found.search_probes == math.ceil(math.log2(len(list(axis.question.names)) - 1))
    heard: list[ProbeEntry] = []
    history = transformers_history()
    summary = release_bisect(target, "transformers", good, bad, transformers_index(),
                             probes=history.probes, strategy=strategy,
                             on_probe=heard.append)  # fmt: skip
    assert summary.status == "found", summary.result
    assert summary.launched <= found.probes
    left = [entry.steps_left for entry in heard]
    assert left[-1] == 0, left
    for done, steps in enumerate(left, start=1):  # never fewer than what really remained
        assert steps is not None and steps >= len(heard) - done, left


def test_a_flaky_plan_is_an_estimate_capped_by_max_runs(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    _, axis = release_axis(target, "transformers", "4.44.2", "4.46.3", transformers_index())
    found = plan.plan(axis, Strategy(flaky=True, max_runs=20), "hist", "broken", "cpu")
    assert found.estimate and found.strategy == "flaky" and found.probes == 20
    assert "estimate" in found.rule and "--max-runs 20" in found.rule
    assert plan.StepsLeft(list(axis.question.names), Strategy(flaky=True)).after(
        ProbeEntry(key="4.44.2#1", item="4.44.2", verdict="reproduced")
    ) is None  # fmt: skip


def test_yanked_candidates_are_in_the_plan_and_marked(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    _, axis = release_axis(target, "transformers", "4.45.2", "4.46.1", transformers_index())
    found = plan.plan(axis, Strategy(), "hist", "broken", "cpu")
    assert found.candidates == ["4.45.2", "4.46.0", "4.46.1"] and found.yanked == ["4.46.0"]


def test_a_metric_plan_is_an_estimate_at_the_smallest_shift(tmp_path: Path) -> None:
    _, axis = release_axis(hist_target(tmp_path), "transformers", "4.46.1", "4.48.2",
                           transformers_index())  # fmt: skip
    strategy = Strategy(flaky=True, metric="loss_gap", max_runs=5000, min_shift=0.5)
    found = plan.plan(axis, strategy, "hist", "broken", "cpu")
    assert found.strategy == "shift" and found.estimate
    assert (
        found.probes == plan.metric_estimate(len(list(axis.question.names)), 0.999, 0.5, 5000) > 300
    )
    assert found.rule.startswith("estimate at a shift of 0.5 sd of loss_gap")
    # a smaller shift that counts takes more launches; the budget caps it
    assert plan.metric_estimate(8, 0.99, 0.25, 100_000) > plan.metric_estimate(
        8, 0.99, 0.5, 100_000
    )
    assert plan.metric_estimate(8, 0.99, 0.25, 2000) == 2000
