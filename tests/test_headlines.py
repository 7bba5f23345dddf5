"""Headlines from measured verdicts, and "Affected" lines that never overstate: records and
summaries written by hand (no repro runs), read through the store, the report and `table`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import NO_ENV, ppo_root, results_dir, save_record

__all__ = ["ppo_root"]  # the fixture, shared with test_report

from conftest import reprobox
from reprobox.core.errors import ExitCode
from reprobox.core.records import RecordStore
from reprobox.report import build as report

LATER = "2026-11-30T01:00:00Z"


def _interrupted(root: Path, variant: str, started: str = LATER) -> None:
    """A later run of the cell that Ctrl-C ended before it measured anything."""
    record = save_record(root, variant, None, reason="interrupted", started=started)
    record.exit_code = int(ExitCode.INTERRUPTED)
    record.save()


def test_the_store_keeps_the_newest_measured_record_and_lists_later_ones(
    ppo_root: Path,
) -> None:
    _interrupted(ppo_root, "broken")
    crashed = save_record(
        ppo_root, "broken", None, reason="rank 1 crashed", started=LATER[:-3] + "5Z"
    )
    cells, problems = RecordStore(results_dir(ppo_root)).histories("ppo")
    (broken,) = [h for h in cells if h.record.label == "broken"]
    assert problems == []
    assert broken.is_measured and broken.record.verdict == "reproduced"
    assert [r.reason for r in broken.unmeasured] == [crashed.reason, "interrupted"]
    # a cell that never measured anything shows its newest run as it is
    _interrupted(ppo_root, "fixed", started="2026-11-30T02:00:00Z")
    _interrupted(ppo_root, "fixed", started="2026-11-30T03:00:00Z")
    only, _ = RecordStore(results_dir(ppo_root)).histories("ppo")
    (fixed,) = [h for h in only if h.record.label == "fixed"]
    assert fixed.is_measured  # the earlier measured clean run is still the verdict
    assert [r.started_at for r in fixed.unmeasured] == [
        "2026-11-30T03:00:00Z",
        "2026-11-30T02:00:00Z",
    ]


def test_an_interrupted_run_never_flips_the_report_headline(ppo_root: Path) -> None:
    _interrupted(ppo_root, "broken")
    asked = report.ReportOptions(collect_env=False, comment_not_run=True)
    comment = report.write_report(ppo_root, "ppo", asked).comment.read_text()
    assert comment.startswith("**Reproduced** with torch 2.13.0+cpu, trl 0.7.1"), comment
    headline = comment.split("\n\n")[0]
    assert "Measured at 2026-11-30T00:00:00Z; 1 later run measured nothing" in headline
    assert comment.count("### Not run") == 1
    assert (
        f"- `broken` at {LATER}: interrupted (the verdict shown was measured at "
        "2026-11-30T00:00:00Z)"
    ) in comment


def test_runs_that_measured_nothing_stay_out_of_the_comment_unless_asked(
    ppo_root: Path,
) -> None:
    """A typo (--with a release that does not exist) and four Ctrl-Cs are the reporter's
    business: report.md lists them, comment.md (what upstream reads) does not."""
    for minute in range(1, 5):
        _interrupted(ppo_root, "broken", started=f"2026-11-30T01:0{minute}:00Z")
    typo = save_record(
        ppo_root, "broken", None, packages={"trl": "9.9.9"},
        reason="cannot resolve trl==9.9.9; see ~/.cache/reprobox/logs/uv-resolve-1.log",
    )  # fmt: skip
    typo.command, typo.exit_code = [], int(ExitCode.ENV_FAILED)
    typo.save()
    made = report.write_report(ppo_root, "ppo", NO_ENV)
    comment, full = made.comment.read_text(), made.markdown.read_text()
    for said in ("measured nothing", "### Not run", "9.9.9", "uv-resolve", "interrupted"):
        assert said not in comment, said
        assert said in full, said
    assert comment.startswith("**Reproduced** with torch 2.13.0+cpu, trl 0.7.1")
    assert "): 6 cells, generated" in comment and ": 7 cells, generated" in full  # the typo


def test_the_table_shows_when_and_exits_by_the_measured_verdicts(ppo_root: Path) -> None:
    _interrupted(ppo_root, "broken")
    done = reprobox("table", "ppo", "--default", "--format", "plain")
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("ppo    broken "))
    assert "reproduced  match" in row and "2026-11-30T00:00:00Z" in row
    assert (
        f"ppo broken: a later run at {LATER} measured nothing (interrupted); the verdict "
        "shown was measured at 2026-11-30T00:00:00Z"
    ) in done.stdout
    # a cell whose only runs measured nothing still decides the exit code, named as such
    _interrupted(ppo_root, "gone")
    never = reprobox("table", "ppo", "--format", "plain")
    assert never.returncode == ExitCode.INTERRUPTED, never.stdout + never.stderr
    assert never.stderr.strip().endswith("ppo gone: no measured verdict; interrupted")


def _sweep(
    root: Path, ident: str, versions: list[str], probes: dict[str, str], **extra: object
) -> None:
    folder = results_dir(root) / "ppo" / "_bisect" / ident
    folder.mkdir(parents=True)
    summary = {
        "kind": "sweep", "status": "mapped", "package": "trl", "variant": "broken",
        "versions": versions, "range": f">={versions[0]},<={versions[-1]}",
        "probes": [{"item": v, "verdict": p} for v, p in probes.items()],
        # what a sweep's own summary may claim; the report reads the probes, not this
        "affected": f">={versions[0]}", "events": [{"introduced": versions[0]}],
        **extra,
    }  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))


WIDE = ["0.4.7", "0.5.0", "0.6.0", "0.7.1", "0.7.2"]


def test_a_narrower_newer_sweep_never_replaces_a_wider_one(ppo_root: Path) -> None:
    r, c = "reproduced", "clean"
    _sweep(ppo_root, "20261130T000000-wide", WIDE, dict(zip(WIDE, [r, r, r, r, c], strict=True)))
    _sweep(ppo_root, "20261130T010000-narrow", WIDE[2:], {"0.6.0": r, "0.7.1": r, "0.7.2": c})
    first = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text().split("\n\n")[0]
    assert first == (
        "**Affected:** trl `>=0.4.7,<=0.7.1` - introduced at or before 0.4.7 (the range's "
        "first release), fixed in 0.7.2 "
        "([0.7.1...0.7.2](https://github.com/huggingface/trl/compare/v0.7.1...v0.7.2)) "
        "(5 of 5 releases probed: 2 sweeps, 3 cells)."
    )


def test_an_event_is_claimed_only_between_adjacent_probed_releases(ppo_root: Path) -> None:
    # 0.5.0 untested: the change is somewhere after 0.4.7, at or before 0.6.0
    _sweep(
        ppo_root,
        "20261130T000000-gap",
        WIDE,
        {"0.4.7": "clean", "0.6.0": "reproduced", "0.7.2": "clean"},
        untested=["0.5.0"],
    )
    first = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text().split("\n\n")[0]
    assert first.startswith(
        "**Affected:** trl `>=0.6.0,<=0.7.1` - introduced after 0.4.7, at or before 0.6.0, "
        "fixed in 0.7.2 "
    ), first
    assert first.endswith("(4 of 5 releases probed: 1 sweep, 3 cells; 1 untested).")


def test_a_release_measured_both_ways_claims_nothing_next_to_it(ppo_root: Path) -> None:
    # the sweep says 0.7.1 is clean; the report's own cells say it reproduces
    _sweep(ppo_root, "20261130T000000-odd", WIDE, {"0.6.0": "reproduced", "0.7.1": "clean"})
    first = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text().split("\n\n")[0]
    assert "fixed in" not in first and "introduced in" not in first, first
    assert "introduced at or before 0.6.0 (the first release probed)" in first
    assert "fixed after 0.6.0, at or before 0.7.2" in first
    assert "**Not certain:** 0.7.1 gave clean (sweep 20261130T000000-odd) and reproduced" in first
    assert "(cell broken)" in first and "(cell broken\\[trl=0.7.1\\])" in first


def test_the_terminal_shows_the_home_folder_as_tilde(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/cli.md: error lines are scrubbed; a terminal capture pasted into an issue names
    no folder of the reporter's machine (the report's own lines neither)."""
    home = tmp_path / "home" / "someone"
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "x.txt").write_text("mine\n")
    monkeypatch.setenv("HOME", str(home))
    refused = reprobox("report", "ppo", "--no-env", "--out", str(home / "notes"))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "reprobox: error: ~/notes exists and is not a reprobox report; choose another --out"
    )
    made = reprobox("report", "ppo", "--no-env", "--out", str(home / "report"))
    assert made.returncode == 0, made.stderr
    assert str(home) not in made.stdout + made.stderr
    assert "comment: ~/report/comment.md" in made.stderr
