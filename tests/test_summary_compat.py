"""Summaries on disk stay readable: each kind's `summary.json` as the flat model of before
the tagged `details` wrote it (kept in tests/fixtures/summaries_v1, captured from the bisect
tests' own runs) loads, with its kind's fields where the report reads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reprobox.bisect.summary import (
    BisectSummary,
    CommitDetails,
    DateDetails,
    ReleaseDetails,
    SweepDetails,
    read_summaries,
    read_summary,
)

OLD = Path(__file__).parent / "fixtures" / "summaries_v1"


def _load(name: str, tmp_path: Path) -> BisectSummary:
    folder = tmp_path / name.removesuffix(".json")
    folder.mkdir()
    shutil.copy(OLD / name, folder / "summary.json")
    return read_summary(folder / "summary.json")


def test_an_old_release_summary_loads(tmp_path: Path) -> None:
    s = _load("release_found.json", tmp_path)
    assert isinstance(s.details, ReleaseDetails)
    assert (s.kind, s.status, s.package, s.details.good, s.details.bad) == (
        "release", "found", "transformers", "4.48.1", "4.48.0"
    )  # fmt: skip
    assert s.first == "4.48.1" and s.result.startswith("first clean release")
    assert len(s.probes) == s.runs > 0


def test_an_old_non_monotone_release_summary_keeps_its_contradictions(tmp_path: Path) -> None:
    s = _load("release_non_monotone.json", tmp_path)
    assert s.status == "non-monotone" and s.contradictions


def test_old_flaky_and_metric_summaries_keep_their_posterior(tmp_path: Path) -> None:
    flaky = _load("release_flaky.json", tmp_path)
    assert (flaky.strategy, flaky.status) == ("flaky", "no-change") and flaky.outcomes
    shift = _load("release_shift.json", tmp_path)
    assert (shift.strategy, shift.metric) == ("shift", "loss_gap") and shift.levels


def test_an_old_sweep_summary_keeps_its_map(tmp_path: Path) -> None:
    s = _load("sweep.json", tmp_path)
    assert (s.kind, s.status, s.package) == ("sweep", "mapped", "transformers")
    assert isinstance(s.details, SweepDetails)
    assert s.details.affected and s.details.events and s.details.range


def test_an_old_date_summary_keeps_its_day_and_culprit(tmp_path: Path) -> None:
    s = _load("date.json", tmp_path)
    day = s.details
    assert isinstance(day, DateDetails) and s.package is None
    assert (s.kind, day.start, day.end, day.floated) == (
        "date", "2023-10-01", "2023-11-10", ["accelerate"]
    )  # fmt: skip
    assert day.culprit == ["accelerate 0.23.0 -> 0.24.0"] and day.released_on_day
    assert s.first == "2023-10-24"


def test_an_old_commit_summary_keeps_the_commit_it_named(tmp_path: Path) -> None:
    s = _load("commit_descended.json", tmp_path)
    asked = s.details
    assert isinstance(asked, CommitDetails)
    assert (s.kind, s.package, asked.first_parent) == ("commit", "reprobox-flagpkg", False)
    assert asked.commit is not None and asked.commit.pr == 15
    assert asked.descended == [asked.commit.merge]
    assert asked.good_sha and asked.bad_sha and asked.repo


@pytest.mark.parametrize("name", sorted(p.name for p in OLD.glob("*.json")))
def test_an_old_summary_written_again_reads_the_same(name: str, tmp_path: Path) -> None:
    """Loaded, written as today's code writes it and read again: nothing is lost."""
    old = _load(name, tmp_path)
    again = tmp_path / "again" / "summary.json"
    again.parent.mkdir()
    again.write_text(old.model_dump_json())
    assert read_summary(again).model_dump() == old.model_dump()


def test_a_summary_of_no_known_kind_is_refused(tmp_path: Path) -> None:
    """A kind the union does not know is an error naming the summary, not a release."""
    path = tmp_path / "x" / "summary.json"
    path.parent.mkdir()
    path.write_text('{"kind": "bogus", "status": "found"}')
    with pytest.raises(ValueError, match="not a bisect summary"):
        read_summary(path)


def test_a_folder_of_old_summaries_reads_whole(tmp_path: Path) -> None:
    for name in sorted(p.name for p in OLD.glob("*.json")):
        _load(name, tmp_path)
    found, skipped = read_summaries(tmp_path)
    assert (len(found), skipped) == (len(list(OLD.glob("*.json"))), [])
