"""Non-monotone histories are never answered as certain. The history is transformers' loss
bug as it happened: fixed in 4.46.0, regressed in 4.47.0, patched in 4.47.1, back in 4.48.0,
fixed in 4.48.1. Runs are fake; the bisect, the checks, the sweep and the records are real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bisect_fakes import C, R, hist_target, transformers_history, transformers_index

from reprobox.bisect.prober import BisectError
from reprobox.bisect.releases import release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import SUMMARY_FILE, SweepDetails, read_summary
from reprobox.bisect.sweep import affected_ranges, events_line, sweep
from reprobox.core.cells import make_cell
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore


def test_the_answer_says_what_it_assumed(tmp_path: Path) -> None:
    history = transformers_history()
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.48.1", "4.48.0", transformers_index(),
        probes=history.probes,
    )  # fmt: skip
    assert summary.result == (
        "first clean release: transformers 4.48.1 (assuming one change between 4.48.0 and "
        "4.48.1; 2 of 2 releases probed)"
    )


def test_verify_probes_catch_a_change_that_came_back(tmp_path: Path) -> None:
    history = transformers_history()
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=2), probes=history.probes,
    )  # fmt: skip
    # Today's answer was "first clean release: transformers 4.47.1", although 4.48.0 reproduces.
    assert summary.status == "non-monotone"
    assert [(c.item, c.verdict, c.source) for c in summary.contradictions] == [
        ("4.48.0", R, "verify probe")
    ]
    assert summary.result.startswith(
        "non-monotone: transformers 4.48.0 reproduces (verify probe), against the bisect's "
        "answer (first clean release: transformers 4.47.1)"
    )
    assert (
        "reprobox sweep hist --package transformers --range '>=4.47.0,<=4.49.0'" in summary.result
    )
    assert "4.48.0" in summary.verified


def test_a_large_range_is_verified_by_default(tmp_path: Path) -> None:
    history = transformers_history()
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.49.0", "4.44.2", transformers_index(),
        probes=history.probes,
    )  # fmt: skip
    assert summary.items == 15 and len(summary.verified) == 4  # 2 on each side
    assert summary.status == "non-monotone", summary.result
    assert summary.status != "found"


def _save_record(root: Path, version: str, verdict: str) -> None:
    store = RecordStore(root / "results")
    target = hist_target(root)
    cell = make_cell(target.repro, "broken", {"transformers": version})
    run_dir = store.new_run_dir("hist", cell.slug)
    record = Record.for_cell(cell, run_dir)
    record.status, record.verdict = Status.RECORDED, Verdict(verdict)
    record.save()


def test_verdicts_on_disk_are_checked_before_the_answer_is_printed(tmp_path: Path) -> None:
    _save_record(tmp_path, "4.48.0", "reproduced")  # a matrix run the report would show
    _save_record(tmp_path, "4.48.2", "clean")  # agrees
    history = transformers_history()
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=0), probes=history.probes,
    )  # fmt: skip
    assert summary.status == "non-monotone"
    [against] = summary.contradictions
    assert against.item == "4.48.0" and against.source.startswith("record ")
    assert "4.48.0" not in history.items_run()  # known from disk, not probed
    saved = json.loads(Path(summary.summary_path).read_text())
    assert saved["status"] == "non-monotone"


def test_both_ends_alike_says_the_change_may_have_come_and_gone(tmp_path: Path) -> None:
    history = transformers_history()
    with pytest.raises(BisectError) as caught:
        release_bisect(
            hist_target(tmp_path), "transformers", "4.46.3", "4.48.1", transformers_index(),
            probes=history.probes,
        )  # fmt: skip
    message = str(caught.value)
    assert message.startswith("--bad 4.48.1 is clean, not reproduced: both ends are clean")
    assert "the change came and went inside the range" in message
    assert "reprobox sweep hist --package transformers --range '>=4.46.3,<=4.48.1'" in message
    assert "\n" not in message


def test_wrong_way_round_ends_are_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(BisectError, match="are --good and --bad the right way round"):
        release_bisect(
            hist_target(tmp_path), "transformers", "4.45.0", "4.46.1", transformers_index(),
            probes=transformers_history().probes,
        )  # fmt: skip


def test_a_sweep_maps_every_release_as_advisory_ranges(tmp_path: Path) -> None:
    history = transformers_history()
    target = hist_target(tmp_path)
    summary = sweep(
        target, "transformers", ">=4.44.2,<=4.49.0", transformers_index(), probes=history.probes
    )
    swept = summary.details
    assert isinstance(swept, SweepDetails)
    assert swept.affected == ">=4.44.2,<4.46.0; ==4.47.0; ==4.48.0"
    events = [(e.introduced, e.fixed) for e in swept.events]
    assert events == [
        ("4.44.2", None), (None, "4.46.0"), ("4.47.0", None), (None, "4.47.1"),
        ("4.48.0", None), (None, "4.48.1"),
    ]  # fmt: skip
    assert len(history.calls) == 15 and "4.47.0rc1" not in history.items_run()
    assert summary.yanked == ["4.46.0"]
    assert summary.result.startswith(
        "transformers affected: >=4.44.2,<4.46.0; ==4.47.0; ==4.48.0 (15 of 15 releases tested; "
        "introduced at or before 4.44.2 (the range's first release); the verdict changes 6 times"
    )
    # the range's first release reproduces: a bound, never "introduced 4.44.2" as a fact
    assert swept.events[0].bound and not any(e.bound for e in swept.events[1:])
    assert events_line(swept.events, summary.versions).startswith(
        "introduced at or before 4.44.2 (the range's first release), fixed 4.46.0, "
    )
    # the summary lies beside the probe log, and reads back the same
    path = Path(summary.summary_path)
    assert path.name == SUMMARY_FILE and (path.parent / "probes.jsonl").is_file()
    assert read_summary(path).details == swept

    # A later bisect of a stretch inside it is checked against the sweep's verdicts.
    again = release_bisect(
        target, "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=0), probes=transformers_history().probes,
    )  # fmt: skip
    assert again.status == "non-monotone"
    assert any(c.source == f"bisect {path.parent.name}" for c in again.contradictions)


def test_affected_ranges_with_untested_releases_and_an_open_end() -> None:
    ranges, events, untested = affected_ranges(
        [("1.0", C), ("1.1", R), ("1.2", None), ("1.3", R), ("1.4", C), ("1.5", R), ("1.6", R)]
    )
    assert ranges == [">=1.1,<1.4", ">=1.5,<=1.6"]
    assert untested == ["1.2"]
    assert [(e.introduced, e.fixed, e.last_affected, e.bound) for e in events] == [
        ("1.1", None, None, False), (None, "1.4", None, False), ("1.5", None, None, False),
        (None, None, "1.6", True),
    ]  # fmt: skip
    names = ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6"]
    assert events_line(events, names) == (
        "introduced 1.1, fixed 1.4, introduced 1.5, still reproduces at 1.6, the range's last "
        "release"
    )
    # an event next to an untested release is a bound: it happened after 1.0, at or before 1.2
    _, gap, _ = affected_ranges([("1.0", C), ("1.1", None), ("1.2", R), ("1.3", C)])
    assert events_line(gap, ["1.0", "1.1", "1.2", "1.3"]) == (
        "introduced after 1.0, at or before 1.2 (untested between), fixed 1.3"
    )
    assert affected_ranges([("1.0", C), ("1.1", C)]) == ([], [], [])
    assert affected_ranges([("1.0", R)])[0] == ["==1.0"]


def test_the_cli_exits_1_on_a_non_monotone_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reprobox.bisect import releases
    from reprobox.bisect import sweep as sweep_module
    from reprobox.cli import cells as cli_cells
    from reprobox.cli import main as cli_main

    hist_target(tmp_path)
    (tmp_path / "fixes").mkdir()
    (tmp_path / "noxfile.py").write_text("")
    monkeypatch.setenv("REPROBOX_ROOT", str(tmp_path))
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(cli_cells, "index", lambda args: transformers_index())

    def fake_probes(*args: object) -> object:
        return transformers_history().probes

    monkeypatch.setattr(releases, "release_probes", fake_probes)
    monkeypatch.setattr(sweep_module, "release_probes", fake_probes)
    args = ["--package", "transformers", "--variant", "broken"]
    ends = ["--good", "4.49.0", "--bad", "4.47.0", "--verify", "2"]
    # --confirm 1: its probes are the sweep's 10 verdicts on disk below (the verify probe
    # that contradicts the answer, 4.48.0, is launched 3 times before it is believed)
    code = cli_main.main(["bisect", "hist", *args, *ends, "--confirm", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 1 and out[-1].startswith("non-monotone: transformers 4.48.0 reproduces")
    code = cli_main.main(["sweep", "hist", *args, "--range", ">=4.47.0,<=4.49.0"])
    captured = capsys.readouterr()
    assert code == 0
    assert (
        captured.out.strip()
        .splitlines()[-1]
        .startswith(
            "transformers affected: ==4.47.0; ==4.48.0 (7 of 7 releases tested; 10 verdict(s) on "
            "disk agree; introduced at or "
            "before 4.47.0 (the range's first release); the verdict changes 4 times"
        )
    )
    assert (
        "events: introduced at or before 4.47.0 (the range's first release), fixed 4.47.1, "
        "introduced 4.48.0, fixed 4.48.1" in (captured.err)
    )
