"""Yanked releases install by exact pin: a bisect takes them as candidates, marked, and says
so when the boundary is one; a range axis says what it left out and why."""

from __future__ import annotations

from pathlib import Path

from bisect_fakes import R, hist_target, transformers_history, transformers_index
from packaging.version import Version

from fakes import FakeIndex
from reprobox.bisect.releases import release_bisect, release_range
from reprobox.envs.index import IndexAxes, Release, select, select_explained


def test_a_yanked_release_is_a_candidate_and_the_answer_says_it_is_yanked(
    tmp_path: Path,
) -> None:
    index = transformers_index()
    assert release_range(index, "transformers", "4.46.1", "4.44.2") == [
        "4.44.2", "4.45.0", "4.45.1", "4.45.2", "4.46.0", "4.46.1",
    ]  # fmt: skip
    history = transformers_history()  # fixed in 4.46.0, the yanked one
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.46.1", "4.44.2", index, probes=history.probes
    )
    assert summary.status == "found" and summary.first == "4.46.0"  # not 4.46.1
    assert summary.yanked == ["4.46.0"]
    assert summary.result.startswith(
        "first clean release: transformers 4.46.0, a yanked release (assuming one change "
        "between 4.44.2 and 4.46.1; "
    )
    marked = {p.item: p.tags for p in summary.probes}
    assert marked["4.46.0"] == ["yanked"] and marked["4.44.2"] == []


def test_a_yanked_release_just_before_the_boundary_is_named(tmp_path: Path) -> None:
    history = transformers_history(**{"4_46_0": R})  # the fix landed in 4.46.1 instead
    summary = release_bisect(
        hist_target(tmp_path),
        "transformers", "4.46.1", "4.44.2", transformers_index(), probes=history.probes,
    )  # fmt: skip
    assert summary.first == "4.46.1"
    assert "right after 4.46.0 (reproducing, yanked)" in summary.result


def test_skipped_yanked_candidates_are_marked_in_the_ambiguous_answer(tmp_path: Path) -> None:
    history = transformers_history(**{"4_46_0": None})  # cannot be tested here
    summary = release_bisect(
        hist_target(tmp_path),
        "transformers", "4.46.1", "4.44.2", transformers_index(), probes=history.probes,
    )  # fmt: skip
    assert summary.status == "ambiguous"
    assert "could be any of: transformers 4.46.0 (yanked), 4.46.1 (" in summary.result


RELEASES = [
    Release(Version("4.45.2")),
    Release(Version("4.46.0"), yanked=True),
    Release(Version("4.46.1")),
    Release(Version("4.47.0rc1")),
    Release(Version("4.47.0")),
]


def test_a_range_axis_lists_what_it_left_out_and_why() -> None:
    chosen = select_explained(RELEASES, ">=4.45.2,<=4.47.0")
    assert [str(v) for v in chosen.kept] == ["4.45.2", "4.46.1", "4.47.0"]
    assert [(str(v), why) for v, why in chosen.left_out] == [
        ("4.46.0", "yanked"),
        ("4.47.0rc1", "pre-release"),
    ]
    assert chosen.note("transformers") == (
        "transformers: left out of the range: 4.46.0 (yanked), 4.47.0rc1 (pre-release)"
    )
    assert select(RELEASES, ">=4.45.2,<=4.47.0") == chosen.kept  # select is unchanged
    everything = select_explained(RELEASES, ">=4.45.2", prereleases=True, include_yanked=True)
    assert everything.left_out == [] and len(everything.kept) == 5


def test_a_range_axis_says_what_it_left_out() -> None:
    axes = IndexAxes(FakeIndex({"transformers": RELEASES}))
    assert axes("transformers", ">4.45.2") == ["4.46.1", "4.47.0"]
    assert axes.notes() == [
        "transformers: left out of the range: 4.46.0 (yanked), 4.47.0rc1 (pre-release)"
    ]
