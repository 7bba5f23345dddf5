"""Commit bisection: which commit of a package's git history flips a variant's verdict.

From a release answer to the commit (trl 0.7.1 -> 0.7.2 holds dozens of commits): the
repository is cloned or fetched once into the cache, the first-parent history between two
refs is searched (a merged or squash-merged pull request is one step), and every probe runs
a wheel built from its commit (kept per sha). A commit that does not build or install is a
skip; the probe log, resumption, confirmation, verification and the honesty rules are the
release bisect's (`Prober`, `search.bisect`, `checks`). With `first_parent=False` an answer
that is a merge is searched again along its second parent, to the commit inside the pull
request. The answer names the commit, its subject, the pull request, the author and a link.
"""

from __future__ import annotations

import email.parser
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from reprobox.bisect.answer_line import answer, verdict_word
from reprobox.bisect.axes import Question
from reprobox.bisect.driver import drive
from reprobox.bisect.outcome import Outcome
from reprobox.bisect.prober import Prober, Probes, Target, answering, pin_overrides, pipeline_probes
from reprobox.bisect.search import BisectResult, bisect
from reprobox.bisect.strategy import BINARY, Strategy
from reprobox.bisect.summary import (
    BisectSummary,
    CommitAnswer,
    CommitDetails,
    ProbeEntry,
    read_summaries,
)
from reprobox.core.cells import Cell, make_cell
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.core.settings import Settings
from reprobox.envs import git
from reprobox.run import pipeline

MAX_DESCENT = 8  # merges of merges followed at most this deep
_REPO_LABELS = ("source", "source code", "repository", "code", "github", "homepage")


def commit_bisect(
    target: Target,
    package: str,
    *,
    repo: str | None = None,
    good: str | None = None,
    bad: str | None = None,
    tag_format: str | None = None,
    first_parent: bool = True,
    strategy: Strategy = BINARY,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
    probes: Probes[str] | None = None,
) -> BisectSummary:
    """Bisect the commits of `package` between `good` (clean) and `bad` (reproduces), refs
    of `repo`; without refs, between the release tags around a finished release bisect of
    the same repro. `probes` replaces the real runs (tests)."""
    strategy = strategy.check()  # a bad flag is said before the repository is cloned
    target, axis = commit_axis(
        target, package, repo=repo, good=good, bad=bad, tag_format=tag_format,
        first_parent=first_parent, probes=probes,
    )  # fmt: skip
    return drive(target, axis, strategy, log_path=log_path, on_probe=on_probe)


@dataclass(frozen=True)
class CommitAxis:
    """The first-parent commits of a package's history between two refs, each a probe of a
    wheel built from that commit; with `first_parent` False a merge answer is searched again
    along its branch, and the answer names the commit as a maintainer looks it up."""

    question: Question[str]
    target: Target  # its other overrides pinned to one commit each
    package: str
    url: str
    clone: Path
    first_parent: bool = True
    fake: Probes[str] | None = None  # tests: probes that stand for the real runs

    def name(self, item: str) -> str:
        return item

    def probes(self, runs: Path) -> Probes[str]:
        if self.fake is not None:
            return self.fake
        return commit_probes(self.target, self.package, self.url, runs)

    def refine(
        self, outcome: Outcome[str], prober: Prober[str], strategy: Strategy
    ) -> Outcome[str]:
        """With `first_parent` False, a merge answer is searched again along its branch; a
        found answer names its commit."""
        final = outcome.result
        assert final is not None
        descended: list[str] = []
        said: list[str] = []
        inside: set[str] = set()  # the commits of merged branches that were searched
        while not self.first_parent and final.status == "found" and len(descended) < MAX_DESCENT:
            merge = git.commit(self.clone, final.first_end)
            if not merge.is_merge:
                break
            inner, note, branch = _descend(prober, self.clone, merge, final, strategy.confirm)
            inside.update(branch)
            if inner is None:
                said.append(note)
                break
            descended.append(merge.sha)
            final = inner
        notes = f"; {said[0]}" if said else ""
        if descended:
            items = {p.item for p in prober.runs}
            merges = ", ".join(sha[:10] for sha in descended)
            notes += f"; then {len(items & inside)} of {len(inside)} commits inside {merges}"
        asked = self.question.asked.details
        assert isinstance(asked, CommitDetails)
        found = final.status == "found" and not outcome.found  # the summary's "found"
        named = _answer(self.clone, self.url, final.first_end, descended) if found else None
        details = asked.model_copy(
            update={"first_parent": self.first_parent, "descended": descended, "commit": named}
        )
        return replace(outcome, final=final, details=details, notes=notes)

    def answer(self, summary: BisectSummary, outcome: Outcome[str]) -> str:
        return answer_line(summary, self.clone, self.question.ends)


def commit_axis(
    target: Target,
    package: str,
    *,
    repo: str | None = None,
    good: str | None = None,
    bad: str | None = None,
    tag_format: str | None = None,
    first_parent: bool = True,
    probes: Probes[str] | None = None,
) -> tuple[Target, CommitAxis]:
    """The commit axis of `package` from one ref to the other (the repository cloned or
    fetched once, here), and the target every probe runs."""
    repro, platform, settings = target.repro, target.options.platform, target.settings
    name = repro.check_pinned(package, "--package")
    target = pin_overrides(target, [name])  # other packages' sources: one commit each
    if (good is None) != (bad is None):
        raise BadInput("give both --good and --bad, or neither (to start from a release bisect)")
    url = git.normalize_url(repo or repo_from_metadata(name, settings))
    clone = git.ensure_clone(url, settings)  # cloned or fetched once, here
    if good is None or bad is None:
        good, bad = release_ends(target, name, clone, tag_format)
    good_sha, bad_sha = (git.resolve(url, ref, settings) for ref in (good, bad))
    if good_sha == bad_sha:
        raise BadInput(f"--good {good} and --bad {bad} are the same commit: nothing to bisect")
    if git.is_ancestor(clone, good_sha, bad_sha):
        older, newer = good_sha, bad_sha
    elif git.is_ancestor(clone, bad_sha, good_sha):
        older, newer = bad_sha, good_sha
    else:
        raise BadInput(
            f"--good {good} and --bad {bad} are not ancestors of each other in {url}: a commit "
            "bisect walks the history from one to the other"
        )
    shas = git.first_parent_range(clone, older, newer)
    header: dict[str, Any] = {
        "kind": "commit", "repro": repro.name, "variant": target.variant, "package": name,
        "repo": url, "good": good, "bad": bad, "good_sha": good_sha, "bad_sha": bad_sha,
        "platform": platform, "versions": shas, **target.header(),
    }  # fmt: skip
    # not in the header: a search that descends into a merge resumes the first-parent one
    question = Question(
        noun="commit", candidates=shas, header=header,
        asked=BisectSummary.model_validate({**header, "first_parent": first_parent}),
        names=tuple(shas), good=good_sha, bad=bad_sha,
        ends_shown={good_sha: f"{good} ({good_sha[:10]})", bad_sha: f"{bad} ({bad_sha[:10]})"},
        ends=(shas[0][:10], shas[-1][:10]),
    )  # fmt: skip
    return target, CommitAxis(question, target, package, url, clone, first_parent, probes)


def commit_probes(target: Target, package: str, url: str, runs: Path) -> Probes[str]:
    """Probes that run each commit's wheel through the pipeline: the override
    `git+URL@SHA` locks a wheel built from that commit (built once per sha)."""
    repro, platform, settings = target.repro, target.options.platform, target.settings

    def source(sha: str) -> dict[str, str]:
        return target.packages({package: f"git+{url}@{sha}"})

    def lock_of(sha: str) -> Path:
        return pipeline.lock_for(repro, target.variant, platform, source(sha), settings=settings)

    def cell_of(sha: str) -> Cell:
        return make_cell(repro, target.variant, source(sha), None, platform)

    return pipeline_probes(target, lock_of, cell_of, runs)


def _descend(
    prober: Prober[str],
    clone: Path,
    merge: git.Commit,
    outer: BisectResult[str],
    confirm: int,
) -> tuple[BisectResult[str] | None, str, list[str]]:
    """Search a merge's second parent, from where it forked, for the commit inside the pull
    request; None (with why) when the branch alone does not show the change. The third
    value lists the branch's commits."""
    mainline, branch = merge.parents[0], merge.parents[1]
    fork = git.merge_base(clone, mainline, branch)
    inner = git.first_parent_range(clone, fork, branch)
    start, end = prober(fork, 1), prober(branch, 1)
    if start is not outer.start_verdict or end is not outer.end_verdict:
        said = f"{fork[:10]} is {_word(start)}, {branch[:10]} is {_word(end)}"
        return (
            None,
            (
                f"the merged branch alone does not show the change ({said}): it comes from the "
                f"merge {merge.short} itself (its resolution, or the branch meeting the mainline)"
            ),
            inner,
        )
    with answering():
        result = bisect(inner, prober, confirm=confirm, prefetch=prober.prefetch)
    if result.status != "found":
        return None, f"inside merge {merge.short} the search was {result.status}", inner
    return result, "", inner


def _word(verdict: Verdict | None) -> str:
    return verdict.value if verdict is not None else "untestable"


def _answer(clone: Path, url: str, sha: str, descended: list[str]) -> CommitAnswer:
    """The found commit as a maintainer looks it up; a commit inside a merged pull request
    takes the pull request number of the merge it came in with."""
    found = git.commit(clone, sha)
    merge = git.commit(clone, descended[-1]) if descended else None
    pr = found.pr or (merge.pr if merge else None)
    return CommitAnswer(
        sha=found.sha,
        subject=found.subject,
        author=found.author,
        email=found.email,
        date=found.date,
        pr=pr,
        link=git.web_link(url, sha=found.sha),
        pr_link=git.web_link(url, pr=pr) if pr is not None else None,
        merge=merge.sha if merge else None,
    )


def describe(clone: Path, sha: str) -> str:
    """`f1ba8ac3d2 "Merge pull request #15 from ..."`: a sha as a person reads it."""
    try:
        return f'{sha[:10]} "{git.commit(clone, sha).subject}"'
    except BadInput:
        return sha[:10]


def answer_line(summary: BisectSummary, clone: Path, ends: tuple[str, str]) -> str:
    """The one line a commit bisect ends with: the commit, its pull request, author, link."""
    kind = verdict_word(summary.end_verdict)
    named = summary.details.commit if isinstance(summary.details, CommitDetails) else None
    if summary.status == "found" and named is not None:
        c = named
        pr = f"PR #{c.pr}, " if c.pr is not None else ""
        via = f", merged in {c.merge[:10]}" if c.merge else ""
        link = c.pr_link or c.link
        where = f" {link}" if link else ""
        return (
            f'first {kind} commit: {c.sha[:10]} "{c.subject}" ({pr}by {c.author} <{c.email}>'
            f"{via}){where} ({summary.assumption})"
        )
    if summary.status == "ambiguous":
        listed = ", ".join(describe(clone, sha) for sha in summary.candidates)
        return f"first {kind} commit could be any of: {listed} ({summary.assumption})"
    return answer(summary, "commit", "", ends)


def release_ends(
    target: Target, package: str, clone: Path, tag_format: str | None
) -> tuple[str, str]:
    """(good tag, bad tag) around the answer of the newest finished release bisect of the
    same repro, variant, platform and package."""
    repro, variant, platform = target.repro, target.variant, target.options.platform
    summaries, _ = read_summaries(target.results / repro.name / "_bisect")
    for earlier in summaries:
        if earlier.kind != "release" or earlier.status not in ("found", "ambiguous"):
            continue
        if (earlier.package, earlier.variant, earlier.platform) != (package, variant, platform):
            continue
        if earlier.last_start is None or earlier.first is None:
            continue
        clean_first = earlier.start_verdict == Verdict.CLEAN.value
        good, bad = (earlier.last_start, earlier.first)
        if not clean_first:
            good, bad = bad, good
        return git.release_tag(clone, good, tag_format), git.release_tag(clone, bad, tag_format)
    raise BadInput(
        f"no finished release bisect of {repro.name} {variant} over {package} on {platform} "
        "to start from: run `reprobox bisect` over releases first, or give --good and --bad refs"
    )


def repo_from_metadata(package: str, settings: Settings) -> str:
    """The repository an installed `package` names (Project-URL Source / Repository, or a
    GitHub home page) in any environment of the cache: no network needed."""
    pattern = "*/lib/python*/site-packages/*.dist-info/METADATA"
    for meta in sorted((settings.cache / "envs").glob(pattern)):
        try:
            message = email.parser.Parser().parsestr(meta.read_text(errors="replace"))
        except OSError:
            continue
        if canonicalize_name(message.get("Name", "")) != package:
            continue
        urls = [u.partition(",") for u in message.get_all("Project-URL") or []]
        for label, _, value in urls:
            if label.strip().lower() in _REPO_LABELS and "github.com" in value:
                return value.strip()
        home = message.get("Home-page", "")
        if "github.com" in home:
            return home.strip()
    raise BadInput(
        f"--repo is needed: no installed {package} in the cache names its repository "
        "(Project-URL Source or Repository)"
    )
