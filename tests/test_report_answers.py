"""A report never contradicts itself: every answer it shows (a bisect's boundary or "no
change", a sweep's affected range) is held against the measured cells it shows, and a
conflict is shown as one, never as the headline. A report can be written from sweeps and
bisects alone. The summaries are written by the real driver on fake probes
(tests/bisect_fakes.py); the records as the harness writes them; the report is the real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bisect_fakes import C, FakeHistory, R, hist_target, transformers_history, transformers_index

from reprobox.bisect.prober import Target
from reprobox.bisect.releases import release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.sweep import sweep
from reprobox.core.cells import make_cell
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore
from reprobox.report import build as report

NO_ENV = report.ReportOptions(collect_env=False)
T_TEST = {"test": "one-sample t-test (df 39), mean = 0", "n": 40, "decision": "clean"}


def _cell(
    target: Target, version: str, verdict: Verdict, stat: dict[str, Any] | None = None
) -> None:
    """A measured matrix cell of the bisected variant at one release."""
    cell = make_cell(target.repro, "broken", {"transformers": version})
    record = Record.for_cell(cell, RecordStore(target.results).new_run_dir("hist", cell.slug))
    record.status, record.verdict = Status.MATCH, verdict
    record.expect = verdict.value
    record.result = {"versions": {"transformers": version}, "verdict": verdict.value}
    record.stat = stat
    record.save()


def _comment(root: Path) -> str:
    return report.write_report(root, "hist", NO_ENV).comment.read_text()


def test_no_change_against_a_clean_cell_is_a_conflict_not_the_headline(tmp_path: Path) -> None:
    """The case seen: "no change: reproducing throughout" above a table that shows a release
    of the range clean by a t-test over 40 launches."""
    target = hist_target(tmp_path)
    noisy = FakeHistory(dict.fromkeys([v for v, _ in transformers_history().verdicts.items()], R))
    summary = release_bisect(
        target, "transformers", "4.46.1", "4.46.3", transformers_index(), probes=noisy.probes,
        strategy=Strategy(flaky=True),
    )  # fmt: skip
    assert summary.status == "no-change", summary.result
    assert summary.result.startswith("no change in the range: reproducing throughout")
    _cell(target, "4.46.1", C, T_TEST)  # the good end, clean by a t-test over 40 launches
    comment = _comment(tmp_path)
    head = comment.split("\n\n")[0]
    assert head.startswith("**Conflict:** the release bisect's answer (no change in the range:")
    assert (
        "conflicts with the measured cell `broken[transformers=4.46.1]` (transformers 4.46.1 "
        "clean by one-sample t-test over 40 launches, where the answer implies reproduced): "
        "see both"
    ) in head
    assert not comment.startswith("**Release (no-change)")
    assert "**Not certain:** records in this report contradict this answer" in comment


def test_a_no_change_answer_the_cells_agree_with_stays_the_headline(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    noisy = FakeHistory(dict.fromkeys([v for v, _ in transformers_history().verdicts.items()], R))
    release_bisect(
        target, "transformers", "4.46.1", "4.46.3", transformers_index(), probes=noisy.probes,
        strategy=Strategy(flaky=True),
    )  # fmt: skip
    _cell(target, "4.46.2", R)
    _cell(target, "4.49.0", C)  # outside the range: it says nothing about the answer
    head = _comment(tmp_path).split("\n\n")[0]
    assert head.startswith("**Release (no-change):** no change in the range: reproducing")


def test_a_boundary_a_cell_contradicts_is_a_conflict(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    found = release_bisect(
        target, "transformers", "4.48.1", "4.48.0", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    assert found.status == "found" and found.first == "4.48.1"
    _cell(target, "4.48.1", R)  # the answer says clean from 4.48.1 on
    head = _comment(tmp_path).split("\n\n")[0]
    assert head.startswith("**Conflict:** the release bisect's answer (first clean release:")
    assert "`broken[transformers=4.48.1]` (transformers 4.48.1 reproduced, where" in head
    assert "**Fixed in" not in head


def test_a_boundary_the_cells_agree_with_is_the_headline(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    release_bisect(
        target, "transformers", "4.48.1", "4.48.0", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    _cell(target, "4.48.1", C)
    _cell(target, "4.48.0", R)
    head = _comment(tmp_path).split("\n\n")[0]
    assert head.startswith("**Fixed in transformers 4.48.1:** 4.48.0 is the last release")


def test_a_report_from_sweeps_and_bisects_alone(tmp_path: Path) -> None:
    """Before: "no usable records for hist under ..." (bad input) with only a sweep on disk."""
    target = hist_target(tmp_path)
    sweep(
        target, "transformers", ">=4.46.3,<=4.48.1", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    made = report.write_report(tmp_path, "hist", NO_ENV)
    assert made.records == 0
    comment = made.comment.read_text()
    assert comment.startswith("**Affected:** transformers `==4.47.0` and `==4.48.0`"), comment
    assert "**No cell measured:** the answers above come from the sweeps and bisects" in comment
    assert "Sweep of transformers" in comment  # the probes behind the map


def test_the_expected_behaviour_states_the_declared_test(tmp_path: Path) -> None:
    declared = 'repeats = "auto"\ntest = "t"\nmetric = "loss_gap"\nthreshold = 0.0\neffect = 0.5\n'
    target = hist_target(tmp_path)
    path = tmp_path / "repros" / "hist" / "repro.toml"
    text = path.read_text().replace("[variants.", declared + "\n[variants.", 1)
    path.write_text(text)
    hist_target(tmp_path, text)
    _cell(target, "4.46.1", C, T_TEST)
    comment = _comment(tmp_path)
    expected = comment.split("### Expected behavior\n\n")[1].split("\n\n")[0]
    assert expected.startswith(
        "The run is clean, judged from repeated launches by a one-sample t-test of the mean "
        "of `loss_gap`: reproduced when its 0.9986 interval lies above 0, clean when it lies "
        "below 0.5 (threshold 0, effect 0.5"
    ), expected
    assert "loss_gap` <= 0" not in expected  # not the per-launch rule


def test_a_sweep_a_cell_contradicts_is_not_certain_in_its_line_and_details(
    tmp_path: Path,
) -> None:
    target = hist_target(tmp_path)
    sweep(
        target, "transformers", ">=4.46.3,<=4.48.1", transformers_index(),
        probes=transformers_history().probes,
    )  # fmt: skip
    _cell(target, "4.47.0", C, T_TEST)  # the sweep's probe reproduced there
    comment = _comment(tmp_path)
    head = comment.split("\n\n")[0]
    assert head.startswith("**Affected:** transformers `==4.48.0`"), head  # 4.47.0 claims nothing
    assert "**Not certain:** 4.47.0 gave reproduced (sweep " in head
    assert "clean (cell broken\\[transformers=4.47.0\\])" in head  # markdown-escaped
    assert (
        "- transformers 4.47.0: clean (the broken\\[transformers=4.47.0\\] cell of this report), "
        "the answer implies reproduced"
    ) in comment
