"""Runs against a git ref or a checkout: refs resolved to shas in a cached clone, a wheel per
sha, the commit recorded; bad refs, unclonable repositories and unbuildable commits are one
plain error with nothing half-written in the cache. Real git, real uv builds, real runs of
the flagpkg fixture repro (one plain process, no torch)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from gitrepo_fixture import PACKAGE, FlagRepo

from conftest import FIXTURES, newest_records, reprobox
from reprobox.core.errors import BadInput, EnvError
from reprobox.core.settings import Settings
from reprobox.envs import git


def settings_in(cache: Path) -> Settings:
    return Settings.from_env({"REPROBOX_CACHE": str(cache)})


@pytest.fixture(autouse=True)
def fresh_process_state() -> None:
    """Each test is a new process as far as moving refs go."""
    git._moving.clear()
    git._fetched.clear()


# ---- resolving refs (real git, no builds) ------------------------------------------------------


def test_every_kind_of_ref_resolves_to_its_sha(flagrepo: FlagRepo, tmp_path: Path) -> None:
    settings = settings_in(tmp_path / "cache")
    shas = flagrepo.shas
    assert git.resolve(flagrepo.url, "main", settings) == shas["release"]
    assert git.resolve(flagrepo.url, "v0.1.0", settings) == shas["initial"]
    assert git.resolve(flagrepo.url, "refs/pull/15/head", settings) == shas["feature3"]
    assert git.resolve(flagrepo.url, shas["squash"], settings) == shas["squash"]
    assert git.resolve(flagrepo.url, shas["squash"][:9], settings) == shas["squash"]
    # a local path and its file:// URL share one clone
    assert git.normalize_url(str(flagrepo.path)) == flagrepo.url
    assert len(list((tmp_path / "cache" / "git").glob("*.git"))) == 1


def test_a_sha_is_never_fetched_again_a_branch_is(flagrepo: FlagRepo, tmp_path: Path) -> None:
    copy = tmp_path / "origin"
    shutil.copytree(flagrepo.path, copy)
    settings = settings_in(tmp_path / "cache")
    url = copy.as_uri()
    assert git.resolve(url, "main", settings) == flagrepo.shas["release"]
    shutil.rmtree(copy)  # the origin is gone: only what needs no fetch still works
    git._moving.clear()
    git._fetched.clear()
    assert git.resolve(url, flagrepo.shas["docs"], settings) == flagrepo.shas["docs"]
    with pytest.raises(BadInput, match="cannot fetch"):
        git.resolve(url, "main", settings)


def test_release_tags_in_the_usual_spellings_and_a_given_format(
    flagrepo: FlagRepo, tmp_path: Path
) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(flagrepo.path, copy)
    subprocess.run(["git", "tag", "0.1.5", flagrepo.shas["docs"]], cwd=copy, check=True)
    subprocess.run(["git", "tag", "release-0.1.6", flagrepo.shas["docs"]], cwd=copy, check=True)
    clone = git.ensure_clone(copy.as_uri(), settings_in(tmp_path / "cache"))
    assert git.release_tag(clone, "0.2.0") == "v0.2.0"
    assert git.release_tag(clone, "0.1.5") == "0.1.5"
    assert git.release_tag(clone, "0.1.6", "release-{version}") == "release-0.1.6"
    with pytest.raises(BadInput, match=r"tried v0\.1\.6, 0\.1\.6\); pass --tag-format"):
        git.release_tag(clone, "0.1.6")
    with pytest.raises(BadInput, match="has no"):
        git.release_tag(clone, "0.1.6", "release")


def test_pull_request_numbers_and_links() -> None:
    def pr(subject: str) -> int | None:
        return git.Commit("0" * 40, subject, "a", "e", "d", ()).pr

    assert pr("Merge pull request #15 from carol/feature") == 15
    assert pr("Fix the KL estimate (#758)") == 758
    assert pr("Refer to #12 in the docs") is None
    assert pr("Add (#3) support for x") is None
    url = "https://github.com/huggingface/trl.git"
    assert git.web_link(url, pr=758) == "https://github.com/huggingface/trl/pull/758"
    assert git.web_link("git@github.com:huggingface/trl.git", sha="ab") == (
        "https://github.com/huggingface/trl/commit/ab"
    )
    assert git.web_link("file:///somewhere/trl", sha="ab") is None


def test_bad_sources_are_refused_in_one_line() -> None:
    for value in ("git+file:///x", "git+@main", "git+https://github.com/o/r"):
        with pytest.raises(BadInput, match="git\\+URL@REF"):
            git.split_source(value)


def test_an_unclonable_repository_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(BadInput, match="cannot clone"):
        git.ensure_clone((tmp_path / "missing").as_uri(), settings_in(cache))
    leftovers = [p.name for p in (cache / "git").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_a_commit_that_does_not_build_leaves_no_wheel(flagrepo: FlagRepo, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sha = flagrepo.shas["unbuildable"]
    with pytest.raises(EnvError, match=f"cannot build {PACKAGE} at {sha[:10]}"):
        git.commit_wheel(flagrepo.url, sha, PACKAGE, settings_in(cache))
    wheels = cache / "git-wheels"
    assert [p.name for p in wheels.iterdir() if not p.name.endswith(".lock")] == []


# ---- runs (real envs) --------------------------------------------------------------------------


@pytest.mark.e2e
def test_run_at_a_git_ref_records_its_commit(flagrepo: FlagRepo, flag_root: Path) -> None:
    source = f"{PACKAGE}@git+{flagrepo.url}@refs/pull/15/head"
    proc = reprobox("run", "flagpkg", "--with", source, "--format", "plain")
    assert proc.returncode == 0, proc.stderr
    [record] = newest_records(flag_root / "results", "flagpkg").values()
    sha = flagrepo.shas["feature3"]
    assert record["verdict"] == "reproduced" and record["commits"] == {PACKAGE: sha}
    assert f"{PACKAGE} at commit {sha}" in proc.stderr
    lock = Path(record["lock"]).read_text()
    assert f"/git-wheels/{sha}/" in lock and "--hash=sha256:" in lock
    # verdict: git bisect run's exit codes, at a tag that is clean
    clean = reprobox("verdict", "flagpkg", "--with", f"{PACKAGE}@git+{flagrepo.url}@v0.1.0")
    assert clean.returncode == 0, clean.stderr


@pytest.mark.e2e
def test_a_branch_that_moves_is_resolved_again(
    flagrepo: FlagRepo, flag_root: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "moving"
    shutil.copytree(flagrepo.path, copy)
    subprocess.run(["git", "branch", "-f", "fix", flagrepo.shas["buildfix"]], cwd=copy, check=True)
    source = f"{PACKAGE}@git+{copy.as_uri()}@fix"
    first = reprobox("verdict", "flagpkg", "--with", source)
    assert first.returncode == 0, first.stderr  # clean at buildfix
    subprocess.run(["git", "branch", "-f", "fix", flagrepo.shas["merge"]], cwd=copy, check=True)
    second = reprobox("verdict", "flagpkg", "--with", source)
    assert second.returncode == 1, second.stderr  # reproduced at the merge
    assert f"at commit {flagrepo.shas['merge']}" in second.stderr


@pytest.mark.e2e
def test_with_editable_runs_the_checkout_as_it_is(
    flagrepo: FlagRepo, flag_root: Path, tmp_path: Path
) -> None:
    checkout = tmp_path / "flagpkg-work"
    subprocess.run(["git", "clone", "-q", str(flagrepo.path), str(checkout)], check=True)
    subprocess.run(["git", "checkout", "-q", flagrepo.shas["docs"]], cwd=checkout, check=True)
    clean = reprobox("verdict", "flagpkg", "--with-editable", f"{PACKAGE}={checkout}")
    assert clean.returncode == 0, clean.stderr
    assert f"at commit {flagrepo.shas['docs']}\n" in clean.stderr
    (checkout / "flagpkg" / "_broken.py").write_text("BROKEN = True\n")  # not committed
    proc = reprobox("run", "flagpkg", "--with-editable", f"{PACKAGE}={checkout}")
    assert proc.returncode == 0, proc.stderr  # expected reproduced, and it is
    records = newest_records(flag_root / "results", "flagpkg")
    [record] = records.values()
    assert record["verdict"] == "reproduced"
    assert record["commits"][PACKAGE].startswith(f"{flagrepo.shas['docs']}+dirty.")


@pytest.mark.e2e
def test_bad_refs_and_sources_exit_2_unbuildable_exit_3(
    flagrepo: FlagRepo, flag_root: Path
) -> None:
    missing = reprobox("run", "flagpkg", "--with", f"{PACKAGE}@git+{flagrepo.url}@no-such")
    assert missing.returncode == 2
    assert "no branch, tag or commit 'no-such'" in missing.stderr.splitlines()[-1]
    no_ref = reprobox("run", "flagpkg", "--with", f"{PACKAGE}@git+{flagrepo.url}")
    assert no_ref.returncode == 2 and "git+URL@REF" in no_ref.stderr
    not_git = reprobox("run", "flagpkg", "--with", f"{PACKAGE}@https://x.invalid/a.whl")
    assert not_git.returncode == 2 and "PKG@git+URL@REF" in not_git.stderr
    sha = flagrepo.shas["unbuildable"]
    broken = reprobox("run", "flagpkg", "--with", f"{PACKAGE}@git+{flagrepo.url}@{sha}")
    assert broken.returncode == 3
    assert f"cannot build {PACKAGE} at {sha[:10]}" in broken.stderr.splitlines()[-1]
    for proc in (missing, no_ref, not_git, broken):
        assert "Traceback" not in proc.stderr


def test_a_cell_at_a_source_says_how_to_select_it_again(tmp_path: Path) -> None:
    from reprobox.cli.cells import overrides as _overrides
    from reprobox.cli.main import _parser
    from reprobox.core import spec
    from reprobox.core.cells import make_cell

    repro = spec.load_file(FIXTURES / "repros" / "flagpkg" / "repro.toml", tmp_path)
    url = "git+file:///somewhere/flagpkg@refs/pull/15/head"
    checkout = (tmp_path / "work").as_uri()
    for value in (url, checkout):
        cell = make_cell(repro, "broken", {PACKAGE: value})
        assert cell.expect.value == "reproduced"  # the variant's own expectation
        args = _parser().parse_args(["run", "flagpkg", *cell.run_args()])
        assert _overrides(args) == {PACKAGE: value}
