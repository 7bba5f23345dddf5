"""Verdicts on disk are read from the record store, scoped to the same repro, variant,
platform and overrides, wherever `--log` points; each log keeps its own summary and runs
folder; the date bisect and the sweep are checked too. Runs are fake (scripted histories);
the bisects, sweeps, logs, summaries and the store are real."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from bisect_fakes import (
    HIST_TOML,
    C,
    FakeIndex,
    R,
    hist_target,
    transformers_history,
    transformers_index,
)
from packaging.version import Version

from reprobox.bisect.dates import DateItem, date_bisect
from reprobox.bisect.prober import BisectError, Outcome, Probes
from reprobox.bisect.releases import release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import BisectSummary, DateDetails, ProbeEntry, runs_dir, summary_file
from reprobox.bisect.sweep import sweep
from reprobox.core.cells import make_cell
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore
from reprobox.envs import locks
from reprobox.envs.index import Release

MONOTONE = {"4.48.0": C}  # 4.47.0 reproduces, everything after it is clean


def test_another_repros_log_in_a_sibling_folder_is_not_held_against_the_answer(
    tmp_path: Path,
) -> None:
    other = hist_target(tmp_path, HIST_TOML, name="other")
    logs = tmp_path / "logs"
    # The other repro reproduces at 4.48.0 (its own history), swept with its log in logs/b.
    sweep(
        other, "transformers", ">=4.47.0,<=4.49.0", transformers_index(),
        log_path=logs / "b" / "probes.jsonl", probes=transformers_history().probes,
    )  # fmt: skip
    mine = hist_target(tmp_path)
    summary = release_bisect(
        mine, "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=0), log_path=logs / "a" / "probes.jsonl",
        probes=transformers_history(**MONOTONE).probes,
    )  # fmt: skip
    # main: non-monotone, "transformers 4.48.0 reproduces (bisect b)": the other repro's
    assert summary.status == "found", summary.result
    assert summary.contradictions == []
    assert summary.result.startswith("first clean release: transformers 4.47.1")


def test_a_log_outside_results_still_sees_the_verdicts_in_the_store(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    swept = sweep(
        target, "transformers", ">=4.47.0,<=4.49.0", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    assert Path(swept.summary_path).is_relative_to(RecordStore(target.results).bisect_dir("hist"))
    elsewhere = tmp_path / "elsewhere" / "deep" / "mine.jsonl"
    summary = release_bisect(
        target, "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=0), log_path=elsewhere,
        probes=transformers_history(**MONOTONE).probes,
    )  # fmt: skip
    # main: "found" (the check read elsewhere/, beside the log, and saw none of the sweep)
    assert summary.status == "non-monotone", summary.result
    sources = {c.source for c in summary.contradictions}
    assert sources == {f"bisect {Path(swept.summary_path).parent.name}"}
    assert [c.item for c in summary.contradictions] == ["4.48.0"]
    assert Path(summary.summary_path) == elsewhere.with_name("mine.summary.json")


def test_two_logs_in_one_folder_keep_their_own_summary_and_runs(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    folder = tmp_path / "logs"
    one = release_bisect(
        target, "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=0), log_path=folder / "one.jsonl",
        probes=transformers_history(**MONOTONE).probes,
    )  # fmt: skip
    two = sweep(
        target, "transformers", ">=4.44.2,<=4.46.0", transformers_index(),
        log_path=folder / "two.jsonl", probes=transformers_history().probes,
    )  # fmt: skip
    # main: both wrote logs/summary.json, the second over the first
    assert Path(one.summary_path) == folder / "one.summary.json"
    assert Path(two.summary_path) == folder / "two.summary.json"
    assert BisectSummary.model_validate_json((folder / "one.summary.json").read_text()).kind == (
        "release"
    )
    assert runs_dir(folder / "one.jsonl") == folder / "one.runs"
    assert runs_dir(folder / "two.jsonl") != runs_dir(folder / "one.jsonl")
    default = folder / "x" / "probes.jsonl"  # a default log: its folder is the bisect's
    assert (summary_file(default), runs_dir(default)) == (
        folder / "x" / "summary.json",
        folder / "x" / "runs",
    )


def test_both_ends_clean_names_the_sweep_on_disk(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    swept = sweep(
        target, "transformers", ">=4.46.3,<=4.48.1", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    with pytest.raises(BisectError) as caught:
        release_bisect(
            target, "transformers", "4.46.3", "4.48.1", transformers_index(),
            probes=transformers_history().probes,
        )  # fmt: skip
    message = str(caught.value)
    assert message.startswith(
        "--bad 4.48.1 is clean, not reproduced: both ends are clean in 3 launches each; "
        "verdicts on disk show it "
        f"reproducing at 4.47.0, 4.48.0 (bisect {Path(swept.summary_path).parent.name})"
    )
    assert "reprobox sweep hist --package transformers" in message and "\n" not in message


ACCELERATE = [
    Release(Version("0.23.0"), uploaded=datetime(2023, 9, 22, 10, 0, tzinfo=UTC)),
    Release(Version("0.24.0"), uploaded=datetime(2023, 10, 24, 12, 0, tzinfo=UTC)),
]


def _date_probes(request_of: Callable[[DateItem], locks.LockRequest]) -> Probes[DateItem]:
    """Each day resolves accelerate as of its cutoff; 0.24.0 reproduces."""

    def versions(item: DateItem) -> dict[str, str]:
        request = request_of(item)
        pins = dict(r.split("==") for r in request.requirements if "==" in r)
        if "accelerate" not in pins:
            limit = datetime.fromisoformat(
                dict(request.exclude_newer_packages)["accelerate"].replace("Z", "+00:00")
            )
            ok = [r for r in ACCELERATE if r.uploaded is not None and r.uploaded < limit]
            pins["accelerate"] = str(max(ok, key=lambda r: r.version).version)
        return {"accelerate": pins["accelerate"]}

    def run(item: DateItem, attempt: int) -> Outcome:
        return Outcome("verdict", R if versions(item)["accelerate"] == "0.24.0" else C)

    return Probes(run=run, env_key=lambda i: str(versions(i)), versions=versions)


def test_a_date_bisect_is_checked_against_verdicts_on_disk(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    index = FakeIndex({"accelerate": ACCELERATE})
    # An earlier date bisect of the same repro and floated package saw 2023-10-28 clean.
    earlier = RecordStore(target.results).bisect_dir("hist") / "earlier"
    earlier.mkdir(parents=True)
    seen = BisectSummary(
        kind="date", repro="hist", variant="broken", floated=["accelerate"],
        probes=[ProbeEntry(key="2023-10-28#1", item="2023-10-28", verdict="clean")],
    )  # fmt: skip
    (earlier / "summary.json").write_text(seen.model_dump_json())
    summary = date_bisect(
        target, date(2023, 10, 20), date(2023, 10, 30), ["accelerate"], index=index,
        strategy=Strategy(verify=0), probes_for=_date_probes,
    )  # fmt: skip
    # main: "first reproducing date: 2023-10-24 ...; culprit: accelerate 0.23.0 -> 0.24.0"
    assert summary.status == "non-monotone", summary.result
    [against] = summary.contradictions
    assert (against.item, against.verdict, against.source) == ("2023-10-28", C, "bisect earlier")
    assert isinstance(summary.details, DateDetails) and summary.details.culprit == []
    # another floated package's bisect says nothing about these days
    seen = seen.model_copy(update={"details": DateDetails(floated=["numpy"])})
    (earlier / "summary.json").write_text(seen.model_dump_json())
    again = date_bisect(
        target, date(2023, 10, 20), date(2023, 10, 30), ["accelerate"], index=index,
        strategy=Strategy(verify=0), probes_for=_date_probes,
    )  # fmt: skip
    assert again.status == "found", again.result


def test_a_sweep_says_when_a_verdict_on_disk_disagrees(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    store = RecordStore(target.results)
    cell = make_cell(target.repro, "broken", {"transformers": "4.48.0"})
    record = Record.for_cell(cell, store.new_run_dir("hist", cell.slug))
    record.status, record.verdict = Status.RECORDED, Verdict.CLEAN  # a matrix run saw 4.48.0 clean
    record.save()
    swept = sweep(
        target, "transformers", ">=4.47.0,<=4.49.0", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    [against] = swept.contradictions
    assert (against.item, against.verdict, against.expected) == ("4.48.0", C, R)
    assert against.source == f"record {record.dir}"
    assert "verdicts on disk disagree: 4.48.0 is clean (record " in swept.result
    assert "so the map is not certain; introduced at or before 4.47.0" in swept.result


@pytest.mark.parametrize("strategy", ["flaky", "shift"])
def test_a_noisy_searchs_single_launches_are_not_verdicts_against_a_sweep(
    tmp_path: Path, strategy: str
) -> None:
    """A flake-aware or metric search logs each launch as a probe; on a noisy outcome one
    launch's verdict is a draw (a metric's per-launch rule is a coin flip), so a sweep over
    the same releases does not call it a disagreement (seen on a real metric: "verdicts on
    disk disagree ... so the map is not certain" over a map its t-tests got right)."""
    target = hist_target(tmp_path)
    earlier = RecordStore(target.results).bisect_dir("hist") / "earlier"
    earlier.mkdir(parents=True)
    draws = BisectSummary(
        kind="release", repro="hist", variant="broken", package="transformers",
        strategy=strategy,
        probes=[ProbeEntry(key="4.48.0#1", item="4.48.0", verdict="clean")],
    )  # fmt: skip
    (earlier / "summary.json").write_text(draws.model_dump_json())

    def swept() -> BisectSummary:
        return sweep(
            target, "transformers", ">=4.47.0,<=4.49.0", transformers_index(),
            probes=transformers_history().probes,
        )  # fmt: skip

    quiet = swept()
    assert quiet.contradictions == [] and "disagree" not in quiet.result, quiet.result
    # the same launch logged by a plain bisect is a verdict, and is said to disagree
    plain = draws.model_copy(update={"strategy": "binary"})
    (earlier / "summary.json").write_text(plain.model_dump_json())
    loud = swept()
    assert [c.item for c in loud.contradictions] == ["4.48.0"], loud.result
