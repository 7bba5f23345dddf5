"""Commit bisects over a real git history (tests/gitrepo_fixture.py): the first-parent walk
names the merge of PR #15, `--first-parent=false` the commit inside it, a squash-merged PR
names its number; the unbuildable commit is a skip; kill -9 and a rerun resumes without
re-running a probe; bad refs, repositories and ranges exit 2. Real git, real uv builds, real
runs of the flagpkg fixture repro (one plain process, no torch)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitrepo_fixture import PACKAGE, FlagRepo

from conftest import reprobox
from reprobox.bisect.summary import (
    LOG_FILE,
    BisectSummary,
    CommitAnswer,
    CommitDetails,
    read_summary,
    write_summary,
)

pytestmark = pytest.mark.e2e


def bisect(repo: FlagRepo, *extra: str) -> subprocess.CompletedProcess[str]:
    return reprobox("bisect", "flagpkg", "--commits", "--repo", str(repo.path), *extra)


def summary_of(root: Path) -> BisectSummary:
    [path] = sorted((root / "results" / "flagpkg" / "_bisect").glob("commit-*/summary.json"))
    return read_summary(path)


def test_first_parent_names_the_merge_and_skips_the_unbuildable(
    flagrepo: FlagRepo, flag_root: Path
) -> None:
    proc = bisect(flagrepo, "--good", "v0.1.0", "--bad", "v0.2.0")
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(flag_root)
    merge = flagrepo.shas["merge"]
    assert summary.status == "found" and summary.first == merge
    named = _commit(summary)
    assert (named.pr, named.author) == (15, "Eve Merger")
    assert summary.versions == [flagrepo.shas[n] for n in flagrepo.first_parent()]
    skipped = [p for p in summary.probes if p.skip]
    assert [p.item for p in skipped] == [flagrepo.shas["unbuildable"]]
    assert "cannot build" in skipped[0].reason
    n = len(summary.versions)
    assert summary.distinct_probed <= math.ceil(math.log2(n)) + 2 == summary.bound
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith(f'first reproducing commit: {merge[:10]} "Merge pull request #15')
    assert "PR #15, by Eve Merger" in line


def test_descending_into_the_merge_names_the_culprit_inside(
    flagrepo: FlagRepo, flag_root: Path
) -> None:
    proc = bisect(flagrepo, "--good", "v0.1.0", "--bad", "v0.2.0", "--first-parent=false")
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(flag_root)
    assert summary.first == flagrepo.shas["feature2"]
    assert isinstance(summary.details, CommitDetails)
    assert summary.details.descended == [flagrepo.shas["merge"]]
    named = _commit(summary)
    assert (named.pr, named.author) == (15, "Carol Culprit")
    assert named.merge == flagrepo.shas["merge"]
    assert "feature: turn BROKEN on" in proc.stdout


def test_a_squash_merged_pull_request_is_named_by_its_number(
    flagrepo: FlagRepo, flag_root: Path
) -> None:
    proc = bisect(flagrepo, "--variant", "slow", "--good", "v0.1.0", "--bad", "v0.2.0")
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(flag_root)
    assert summary.first == flagrepo.shas["squash"]
    named = _commit(summary)
    assert (named.pr, named.author) == (12, "Dan Squash")


def _commit(summary: BisectSummary) -> CommitAnswer:
    """The commit a commit bisect's summary names (its details)."""
    assert isinstance(summary.details, CommitDetails) and summary.details.commit is not None
    return summary.details.commit


def test_without_refs_it_starts_from_the_release_bisect(
    flagrepo: FlagRepo, flag_root: Path
) -> None:
    """A finished release bisect on disk (its summary, as `release_bisect` writes it) says
    0.1.0 is clean and 0.2.0 the first to reproduce: the tags v0.1.0 and v0.2.0 are the ends."""
    log = flag_root / "results" / "flagpkg" / "_bisect" / "release-x" / LOG_FILE
    log.parent.mkdir(parents=True)
    release = BisectSummary(
        kind="release", repro="flagpkg", variant="broken", package=PACKAGE,
        good="0.1.0", bad="0.2.0", versions=["0.1.0", "0.2.0"], status="found",
        start_verdict="clean", end_verdict="reproduced", last_start="0.1.0", first="0.2.0",
    )  # fmt: skip
    write_summary(log, release)
    proc = bisect(flagrepo)
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(flag_root)
    assert isinstance(summary.details, CommitDetails)
    assert (summary.details.good, summary.details.bad) == ("v0.1.0", "v0.2.0")
    assert summary.first == flagrepo.shas["merge"]


def test_kill_9_mid_bisect_and_rerun_resumes(flagrepo: FlagRepo, flag_root: Path) -> None:
    args = ["bisect", "flagpkg", "--commits", "--repo", str(flagrepo.path)]
    args += ["--good", "v0.1.0", "--bad", "v0.2.0", "--variant", "slow", "--confirm", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    bisect_dir = flag_root / "results" / "flagpkg" / "_bisect"
    deadline = time.monotonic() + 120
    lines: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        logs = list(bisect_dir.glob(f"commit-*/{LOG_FILE}"))
        lines = logs[0].read_text().splitlines()[1:] if logs else []
        if len(lines) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the bisect finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [log] = bisect_dir.glob(f"commit-*/{LOG_FILE}")
    done = {json.loads(line)["key"] for line in log.read_text().splitlines()[1:] if line}
    assert len(done) >= 2
    rerun = reprobox(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = summary_of(flag_root)
    assert summary.first == flagrepo.shas["squash"]
    keys = [json.loads(line)["key"] for line in log.read_text().splitlines()[1:]]
    assert len(keys) == len(set(keys))  # no probe ran twice
    resumed = {p.key for p in summary.probes if p.resumed}
    assert done <= resumed
    assert summary.launched == len(summary.probes) - len(resumed)


def test_bad_ranges_and_repositories_exit_2(
    flagrepo: FlagRepo, flag_root: Path, tmp_path: Path
) -> None:
    cache = Path(os.environ["REPROBOX_CACHE"])
    cases = {
        "no branch, tag or commit 'nope'": bisect(flagrepo, "--good", "nope", "--bad", "v0.2.0"),
        "not ancestors of each other": bisect(flagrepo, "--good", "side", "--bad", "v0.2.0"),
        "the same commit": bisect(flagrepo, "--good", "v0.2.0", "--bad", "main"),
        "give both --good and --bad": bisect(flagrepo, "--good", "v0.1.0"),
        "no finished release bisect": bisect(flagrepo),
    }
    missing = tmp_path / "no-repo"
    cases["cannot clone"] = reprobox(
        "bisect", "flagpkg", "--commits", "--repo", str(missing), "--good", "a", "--bad", "b"
    )
    for message, proc in cases.items():
        assert proc.returncode == 2, (message, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("reprobox: error: ") and message in last, last
    assert not [p for p in (cache / "git").iterdir() if "no-repo" in p.name and p.suffix != ".lock"]
    assert not (flag_root / "results" / "flagpkg" / "_bisect").is_dir() or not list(
        (flag_root / "results" / "flagpkg" / "_bisect").glob("commit-*")
    )
