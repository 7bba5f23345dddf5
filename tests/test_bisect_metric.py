"""A metric bisect through the one driver, with fake probes: each probe's launch reports a
value of the metric the variant's declared test reads, and the search (strategy "shift")
weighs those values, not the per-launch rule's verdicts. The answer line states the shift,
its posterior, the runs and what it assumed; a log is resumed without a probe run twice;
a launch judged without the metric stops the bisect rather than widening the answer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bisect_fakes import hist_target, transformers_index

from reprobox.bisect.prober import Outcome, ProbeFailed, Probes
from reprobox.bisect.releases import release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import BisectSummary, read_summary
from reprobox.core.protocol import Verdict

RANGE = ["4.46.1", "4.46.2", "4.46.3", "4.47.0", "4.47.1", "4.48.0", "4.48.1", "4.48.2"]
METRIC = Strategy(flaky=True, metric="loss_gap", max_runs=2000)


@dataclass
class Drifting:
    """loss_gap ~ N(0, 1) before `culprit`, N(shift, 1) from it on, seeded by item and
    attempt; each launch's per-launch verdict is the threshold rule at 0.5 (which a 0.5 sd
    shift overlaps: reproduced ~31% before, ~50% after)."""

    culprit: str | None = "4.48.0"
    shift: float = 0.5
    no_value: frozenset[str] = frozenset()
    calls: list[tuple[str, int]] = field(default_factory=list)

    def run(self, item: str, attempt: int) -> Outcome:
        self.calls.append((item, attempt))
        past = self.culprit is not None and RANGE.index(item) >= RANGE.index(self.culprit)
        value = random.Random(f"{item}#{attempt}").gauss(self.shift if past else 0.0, 1.0)
        verdict = Verdict.REPRODUCED if value > 0.5 else Verdict.CLEAN
        shown = None if item in self.no_value else value
        return Outcome("verdict", verdict, record=f"runs/{item}-{attempt}", value=shown)

    @property
    def probes(self) -> Probes[str]:
        return Probes(run=self.run, env_key=lambda item: f"env-{item}")


def _bisect(tmp_path: Path, history: Drifting, **kw: object) -> BisectSummary:
    return release_bisect(
        hist_target(tmp_path), "transformers", "4.46.1", "4.48.2", transformers_index(),
        probes=history.probes, strategy=kw.pop("strategy", METRIC), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_half_sd_shift_is_named_from_the_metric(tmp_path: Path) -> None:
    history = Drifting()
    summary = _bisect(tmp_path, history)
    assert summary.status == "found" and summary.strategy == "shift", summary.result
    assert summary.first == "4.48.0" and summary.last_start == "4.47.1"
    assert summary.result.startswith(
        "first release where loss_gap's mean shifts: transformers 4.48.0 (posterior "
    )
    assert " at and after 4.48.0, " in summary.result and " sd; assuming at most one shift " in (
        summary.result
    )
    assert summary.metric == "loss_gap" and summary.min_shift == 0.25
    assert summary.shift is not None and summary.shift > 0.25
    assert (
        summary.runs == len(history.calls) == sum(int(v[0] or 0) for v in summary.levels.values())
    )
    assert all(p.value is not None for p in summary.probes)  # every sample is in the log
    again = read_summary(Path(summary.summary_path))
    assert again.levels == summary.levels and again.result == summary.result


def test_a_metric_bisect_resumes_from_its_log(tmp_path: Path) -> None:
    first = _bisect(tmp_path, Drifting(), strategy=Strategy(flaky=True, metric="loss_gap",
                                                            max_runs=30))  # fmt: skip
    assert first.status == "undecided" and first.runs == 30
    assert first.result.startswith("undecided after 30 runs (target 0.999): where loss_gap's")
    history = Drifting()
    resumed = _bisect(tmp_path, history)
    assert resumed.status == "found" and resumed.first == "4.48.0"
    assert len(history.calls) == resumed.runs - 30  # the 30 logged launches are not re-run
    assert sum(p.resumed for p in resumed.probes) == 30


def test_no_change_is_claimed_within_the_smallest_shift(tmp_path: Path) -> None:
    strategy = Strategy(flaky=True, metric="loss_gap", max_runs=3000, min_shift=1.0)
    summary = _bisect(tmp_path, Drifting(culprit=None), strategy=strategy)
    assert summary.status == "no-change", summary.result
    assert summary.result.startswith(
        "no change in the range: loss_gap's mean is the same throughout transformers 4.46.1 "
        "to 4.48.2 within 1 sd (posterior "
    )


def test_a_launch_without_the_metric_stops_the_bisect(tmp_path: Path) -> None:
    with pytest.raises(ProbeFailed, match="reported no value of the metric"):
        _bisect(tmp_path, Drifting(no_value=frozenset({"4.46.1"})))
