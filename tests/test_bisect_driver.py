"""The one bisect driver: every axis through it, the date bisect's new check of its ends
against verdicts on disk, and the flake-aware strategy (found, no change, undecided, a fix,
K workers, resumption from the log, the check against verdicts on disk, the CLI's exit code).
Runs are scripted (a seeded noisy history); the driver, prober, log, store and summaries are
the real ones."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest
from bisect_fakes import FakeIndex, hist_target, transformers_index
from test_bisect_disk import ACCELERATE, _date_probes

from reprobox.bisect import driver
from reprobox.bisect.dates import DateItem, date_bisect
from reprobox.bisect.prober import BisectError, Outcome, Probes
from reprobox.bisect.releases import release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import BisectSummary, ProbeEntry, SweepDetails, read_summary
from reprobox.bisect.sweep import sweep
from reprobox.core.protocol import Verdict
from reprobox.core.records import RecordStore

R, C = Verdict.REPRODUCED, Verdict.CLEAN
RANGE = ["4.46.1", "4.46.2", "4.46.3", "4.47.0", "4.47.1", "4.48.0", "4.48.1", "4.48.2"]
FLAKY = Strategy(flaky=True)


@dataclass
class Noisy:
    """Reproduces with probability `p` from `culprit` on (`fixed`: up to it, then clean),
    seeded by item and attempt, so a re-probe is a new, independent run."""

    culprit: str | None = "4.48.0"
    p: float = 0.7
    fixed: bool = False
    calls: list[tuple[str, int]] = field(default_factory=list)
    interrupt_after: int | None = None
    skip: frozenset[str] = frozenset()  # cannot test these
    in_flight: int = 0
    most_at_once: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, item: str, attempt: int) -> Outcome:
        with self.lock:
            if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
                raise KeyboardInterrupt  # killed mid-way
            self.calls.append((item, attempt))
            self.in_flight += 1
            self.most_at_once = max(self.most_at_once, self.in_flight)
        if item in self.skip:
            with self.lock:
                self.in_flight -= 1
            return Outcome("skip", reason="cannot test: no such op here")
        try:
            threading.Event().wait(0.01)
            past = self.culprit is not None and RANGE.index(item) >= RANGE.index(self.culprit)
            bad = past != self.fixed
            hit = random.Random(f"{item}#{attempt}").random() < (self.p if bad else 0.0)
            return Outcome("verdict", R if hit else C, record=f"runs/{item}-{attempt}")
        finally:
            with self.lock:
                self.in_flight -= 1

    @property
    def probes(self) -> Probes[str]:
        return Probes(run=self.run, env_key=lambda item: f"env-{item}")


def _bisect(
    tmp_path: Path, history: Noisy, strategy: Strategy = FLAKY, good: str = "4.46.1",
    bad: str = "4.48.2", **kw: object,
) -> BisectSummary:  # fmt: skip
    return release_bisect(
        hist_target(tmp_path), "transformers", good, bad, transformers_index(),
        probes=history.probes, strategy=strategy, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_every_axis_is_searched_by_the_one_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []
    real = driver.drive

    def spy(target, axis, strategy, **kw):  # type: ignore[no-untyped-def]
        kinds.append(axis.question.asked.kind)
        return real(target, axis, strategy, **kw)

    for module in ("releases", "dates", "commits", "sweep"):
        monkeypatch.setattr(f"reprobox.bisect.{module}.drive", spy)
    plain = Noisy(p=1.0)
    summary = _bisect(tmp_path, plain, Strategy())
    assert summary.status == "found" and summary.first == "4.48.0", summary.result
    index = FakeIndex({"accelerate": ACCELERATE})
    days = date_bisect(
        hist_target(tmp_path), date(2023, 10, 20), date(2023, 10, 30), ["accelerate"],
        index=index, strategy=Strategy(verify=0), probes_for=_date_probes,
    )  # fmt: skip
    assert days.status == "found" and days.first == "2023-10-24", days.result
    mapped = sweep(
        hist_target(tmp_path), "transformers", ">=4.46.1,<=4.48.2", transformers_index(),
        probes=Noisy(p=1.0).probes,
    )  # fmt: skip
    assert isinstance(mapped.details, SweepDetails)
    assert mapped.details.affected == ">=4.48.0,<=4.48.2", mapped.result
    assert mapped.runs == len(RANGE)
    assert kinds == ["release", "date", "sweep"]  # the commit axis: tests/test_commits.py


def test_a_date_bisect_with_ends_alike_names_the_verdicts_on_disk_inside(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    earlier = RecordStore(target.results).bisect_dir("hist") / "earlier"
    earlier.mkdir(parents=True)
    seen = BisectSummary(
        kind="date", repro="hist", variant="broken", floated=["accelerate"],
        probes=[ProbeEntry(key="2023-10-22#1", item="2023-10-22", verdict="reproduced")],
    )  # fmt: skip
    (earlier / "summary.json").write_text(seen.model_dump_json())
    with pytest.raises(BisectError) as caught:  # every day of the range resolves 0.23.0
        date_bisect(
            target, date(2023, 10, 20), date(2023, 10, 23), ["accelerate"],
            index=FakeIndex({"accelerate": ACCELERATE}), probes_for=_date_probes,
        )  # fmt: skip
    # main: "both ends of the range are clean: nothing to bisect; the change may have come..."
    assert str(caught.value).startswith(
        "end 2023-10-23 is clean, not reproduced: both ends are clean in 3 launches each; "
        "verdicts on disk show "
        "it reproducing at 2023-10-22 (bisect earlier): the change came and went inside the "
        "range"
    )


def test_a_noisy_regression_is_found_with_its_confidence_and_runs(tmp_path: Path) -> None:
    history = Noisy()
    summary = _bisect(tmp_path, history)
    assert summary.status == "found", summary.result
    assert (summary.first, summary.last_start) == ("4.48.0", "4.47.1")
    assert summary.strategy == "flaky" and summary.confidence is not None
    assert summary.confidence >= 0.999 and summary.target_confidence == 0.999
    assert summary.runs == len(history.calls) == sum(n for _, n in summary.outcomes.values())
    assert len(set(history.calls)) == len(history.calls)  # a re-probe is a new attempt
    assert any(attempt > 1 for _, attempt in history.calls)
    assert summary.result.startswith(
        f"first reproducing release: transformers 4.48.0 (posterior {summary.confidence:.3f} "
        f"after {summary.runs} runs; reproduces in "
    )
    assert ", 0 of " in summary.result and " before; " in summary.result
    assert abs(sum(summary.posterior.values()) + (summary.no_change or 0) - 1) < 1e-3
    assert read_summary(Path(summary.summary_path)).status == "found"


def test_a_noisy_fix_is_named_as_the_first_clean_release(tmp_path: Path) -> None:
    summary = _bisect(tmp_path, Noisy(fixed=True), good="4.48.2", bad="4.46.1")
    assert summary.status == "found", summary.result
    assert (summary.first, summary.last_start) == ("4.48.0", "4.47.1")
    assert summary.result.startswith("first clean release: transformers 4.48.0 (posterior ")
    assert " before 4.48.0, 0 of " in summary.result


def test_a_candidate_that_cannot_be_tested_is_skipped_and_named(tmp_path: Path) -> None:
    history = Noisy(skip=frozenset({"4.47.1"}))
    summary = _bisect(tmp_path, history)
    assert history.calls.count(("4.47.1", 1)) == 1  # skipped once, never probed again
    assert ("4.47.1", 2) not in history.calls
    assert "cannot test 4.47.1 (skipped)" in summary.result
    assert summary.runs < 60  # it stops once no probe can tell the two apart
    # the boundary is either side of the untestable release: never claimed as 4.48.0 alone
    assert summary.status in ("found", "undecided"), summary.result
    if summary.status == "found":
        assert summary.first == "4.48.0" and summary.last_start == "4.47.1"


def test_no_change_in_the_range_is_an_answer_but_no_boundary(tmp_path: Path) -> None:
    summary = _bisect(tmp_path, Noisy(culprit=None))
    assert summary.status == "no-change", summary.result
    assert summary.first is None and (summary.no_change or 0) >= 0.99
    assert summary.result.startswith(
        "no change in the range: clean throughout transformers 4.46.1 to 4.48.2 (posterior "
    )


def test_out_of_runs_it_is_undecided_and_names_the_candidates(tmp_path: Path) -> None:
    summary = _bisect(tmp_path, Noisy(), Strategy(flaky=True, max_runs=4))
    assert summary.status == "undecided" and summary.runs == 4, summary.result
    assert summary.first is None and summary.candidates
    assert summary.result.startswith(
        "undecided after 4 runs (target 0.999): the first reproducing release could be "
    )
    assert "higher --max-runs" in summary.result


def test_k_workers_probe_at_once_and_find_the_same_release(tmp_path: Path) -> None:
    history = Noisy()
    summary = _bisect(tmp_path, history, Strategy(flaky=True, workers=2))
    assert summary.status == "found" and summary.first == "4.48.0", summary.result
    assert history.most_at_once == 2


def test_a_killed_noisy_bisect_resumes_from_its_log(tmp_path: Path) -> None:
    whole = _bisect(tmp_path / "a", Noisy())
    killed = Noisy(interrupt_after=5)
    log = tmp_path / "b" / "noisy.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _bisect(tmp_path / "b", killed, log_path=log)
    again = Noisy()
    resumed = _bisect(tmp_path / "b", again, log_path=log)
    assert not set(killed.calls) & set(again.calls)  # nothing measured twice
    assert len(killed.calls) + len(again.calls) == whole.runs == resumed.runs
    assert (resumed.status, resumed.first, resumed.confidence) == (
        whole.status, whole.first, whole.confidence,
    )  # fmt: skip
    assert sum(1 for p in resumed.probes if p.resumed) == 5


def test_verdicts_on_disk_that_disagree_leave_it_undecided(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    earlier = RecordStore(target.results).bisect_dir("hist") / "earlier"
    earlier.mkdir(parents=True)
    before = [
        ProbeEntry(key=f"{v}#{n}", item=v, attempt=n, verdict="reproduced")
        for v in RANGE[:4] for n in (1, 2)
    ]  # fmt: skip
    seen = BisectSummary(kind="sweep", repro="hist", variant="broken", package="transformers")
    (earlier / "summary.json").write_text(
        seen.model_copy(update={"probes": before}).model_dump_json()
    )
    summary = _bisect(tmp_path, Noisy())
    assert summary.status == "undecided", summary.result
    assert "verdicts on disk move the posterior off the search's answer" in summary.result
    assert "8 verdict(s) on disk move the posterior" in summary.result


def test_an_undecided_search_only_counts_the_verdicts_on_disk_in(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    earlier = RecordStore(target.results).bisect_dir("hist") / "earlier"
    earlier.mkdir(parents=True)
    agree = [ProbeEntry(key="4.46.2#1", item="4.46.2", verdict="clean")]
    seen = BisectSummary(kind="sweep", repro="hist", variant="broken", package="transformers")
    (earlier / "summary.json").write_text(
        seen.model_copy(update={"probes": agree}).model_dump_json()
    )
    summary = _bisect(tmp_path, Noisy(), Strategy(flaky=True, max_runs=4))
    assert summary.status == "undecided" and summary.agreeing == 0, summary.result
    assert "1 verdict(s) on disk counted in" in summary.result
    assert "move the posterior" not in summary.result


def test_verdicts_on_disk_that_agree_are_counted(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    earlier = RecordStore(target.results).bisect_dir("hist") / "earlier"
    earlier.mkdir(parents=True)
    agree = [ProbeEntry(key="4.46.2#1", item="4.46.2", verdict="clean")]
    seen = BisectSummary(kind="sweep", repro="hist", variant="broken", package="transformers")
    (earlier / "summary.json").write_text(
        seen.model_copy(update={"probes": agree}).model_dump_json()
    )
    summary = _bisect(tmp_path, Noisy())
    assert summary.status == "found" and summary.agreeing == 1, summary.result
    assert "1 verdict(s) on disk agree" in summary.result


def test_a_noisy_date_bisect_names_the_day(tmp_path: Path) -> None:
    def noisy(request_of: Callable[[DateItem], object]) -> Probes[DateItem]:
        plain = _date_probes(request_of)  # type: ignore[arg-type]
        assert plain.versions is not None
        versions = plain.versions

        def run(item: DateItem, attempt: int) -> Outcome:
            bad = versions(item)["accelerate"] == "0.24.0"
            hit = bad and random.Random(f"{item}#{attempt}").random() < 0.7
            return Outcome("verdict", R if hit else C)

        return Probes(run=run, env_key=plain.env_key, versions=versions)

    summary = date_bisect(
        hist_target(tmp_path), date(2023, 10, 20), date(2023, 10, 30), ["accelerate"],
        index=FakeIndex({"accelerate": ACCELERATE}), probes_for=noisy, strategy=FLAKY,
    )  # fmt: skip
    assert summary.status == "found", summary.result
    assert summary.first == "2023-10-24"
    assert summary.result.startswith("first reproducing date: 2023-10-24 (posterior ")


def test_the_cli_never_exits_0_on_an_undecided_bisect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reprobox.bisect import releases
    from reprobox.cli import main as cli_main

    hist_target(tmp_path)
    (tmp_path / "fixes").mkdir()
    (tmp_path / "noxfile.py").write_text("")
    monkeypatch.setenv("REPROBOX_ROOT", str(tmp_path))
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr("reprobox.cli.cells.index", lambda args: transformers_index())
    monkeypatch.setattr(releases, "release_probes", lambda *args: Noisy().probes)
    args = ["bisect", "hist", "--package", "transformers", "--variant", "broken"]
    args += ["--good", "4.46.1", "--bad", "4.48.2", "--flaky"]
    assert cli_main.main([*args, "--max-runs", "4"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("undecided after 4 runs")
    # the same log: the 4 runs above are resumed, not counted again as verdicts on disk
    assert cli_main.main([*args, "--max-runs", "300"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("first reproducing release: transformers 4.48.0 (posterior ")
    with pytest.raises(SystemExit) as refused:  # refused as parsed: one line, exit 2
        cli_main.main([*args, "--confidence", "1.5"])
    assert refused.value.code == 2
    assert "--confidence: must be between 0 and 1, not 1.5" in capsys.readouterr().err
