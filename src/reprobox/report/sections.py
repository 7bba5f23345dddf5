"""The pieces of a report, written for the maintainer who fixes the bug.

Order and wording follow what upstream bug forms ask for: the result first (versions, the
metric, what is clean), the expected behaviour, a minimal reproduction a person runs with
`pip install` and one launcher line, the bisect or sweep answer when there is one (as the
headline), the stack's own environment reports, then the rest collapsed. Each fact appears
once. Text a script or machine wrote only ever goes through `markdown.text` / `code` /
`fence` (see `markdown`'s docstring for why).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reprobox.core import repeat_verdict
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record
from reprobox.report import answers, closure, results
from reprobox.report import markdown as md
from reprobox.report.answers import names
from reprobox.report.bundle import by_hand
from reprobox.report.env_commands import Environment
from reprobox.report.facts import Facts, issue_ref, versions_of
from reprobox.report.files import log_dir
from reprobox.report.machine_text import machine_table
from reprobox.report.markdown import Section
from reprobox.report.reproduce import pin_groups

_MARK = results.MARK
# where the files a comment has no room for are: `--post` publishes them and links them here
FILES_PLACE = "the files' link at the end of this comment"


class Builder(Facts):
    """The sections of one report, from its facts (`facts.Facts`): pure, it reads nothing
    itself. The answers (`answers`) and the results (`results`) are written from the facts
    alone, so they never import this module."""

    # -- the answers (answers.py): the headline and the bisects behind it

    def headline(self) -> Section:
        return answers.headline(self)

    def bisect_details(self) -> Section:
        return answers.bisect_details(self)

    # -- what should happen

    def expected(self) -> Section:
        text = self.repro.spec.repro.expected.strip()
        if not text:
            bug = self.bug_record()
            variant = bug.variant if bug else self.variants[0]
            rules = self._rules(variant)
            rule = " and ".join(f"{md.code(r.metric)} <= {r.above:g}" for r in rules)
            clean = [r.label for r in self.judged if r.verdict == Verdict.CLEAN]
            like = f", as with {names(clean)}" if clean else ""
            # a declared test decides, not the rule one launch is judged by
            declared = repeat_verdict.describe(self._verdict(variant))
            text = (
                f"The run is clean, {declared}{like}."
                if declared
                else f"The run is clean: {rule}{like}."
            )
        else:
            text = md.defuse(text)
        return Section(f"### Expected behavior\n\n{text}")

    # -- how to run it

    def reproduction(self, bundle_hint: bool = True) -> list[Section]:
        """The minimal reproduction: one pip install line, the launcher lines, the script."""
        name = self.repro.name
        shown = [r for r in self.defaults] or [
            r for r in self.records if not (r.packages or r.params)
        ]
        variants = list(dict.fromkeys(r.variant for r in shown)) or self.repro.default_variants
        variants = [v for v in variants if v in self.repro.spec.variants]
        if not variants:
            return []
        first = variants[0]
        lines = pin_groups(
            variants,
            self._pins,
            lambda v: by_hand(self.repro, v, person=True).line(),
            lambda v: self.repro.variant(v).expect.value,
            late=self.repro.spec.env.no_build_isolation,
        )
        fixed = any(self.repro.variant(v).fix for v in variants)
        intro = (
            "On CPU: save the files below beside each other"
            + (" (fixes under `fixes/`)" if fixed else "")
            + ", then run the block. "
            + (
                "Each set of pins gets its own fresh venv, so every variant runs on its own "
                "releases. "
                if len({tuple(self._pins(v)) for v in variants}) > 1
                else ""
            )
            + "The script exits 1 when it reproduces, 0 when clean, 125 when it cannot test "
            "here."
        )
        sections = [Section(f"### Reproduction\n\n{intro}\n\n" + md.fence("\n".join(lines), "sh"))]
        sections += self.code(self.needed_files(variants, shown))
        if bundle_hint:
            locks = [f"repros/{name}/locks/{v}.cpu.txt" for v in variants if v in self.files.locked]
            where = f" (the hashed locks: {', '.join(md.code(x) for x in locks)})" if locks else ""
            sections.append(
                Section(
                    f"The exact environment{where}: `reprobox bundle {name}` writes a folder "
                    f"that runs with no reprobox - `./run.sh {first}` makes a venv from the "
                    "hashed lock and runs the line above."
                )
            )
        return sections

    def needed_files(self, variants: Sequence[str], shown: Sequence[Record]) -> list[str]:
        """The files the launcher lines of `variants` need: what their runs read (the
        records' `files_read`, at the pins shown) when every variant's run says, else the
        script's static import closure (`closure`); the configs they name, their fixes."""
        launches = [self.repro.launch(v) for v in variants if v in self.repro.spec.variants]
        fixes = {self.repro.variant(v).fix or "" for v in variants if v in self.repro.spec.variants}
        script = self.repro.spec.repro.by_hand or self.repro.spec.repro.script
        roots = [script, *(f"fixes/{f}.py" for f in sorted(fixes) if f)]
        configs = [launch.config for launch in launches if launch.config]
        files = {f.shown: f.text for f in self.files.sources}
        read = {v: [n for r in shown if r.variant == v for n in r.files_read] for v in variants}
        if all(read.values()):
            wanted = {*roots, *configs, *(n for names in read.values() for n in names)}
            if script != self.repro.spec.repro.script:  # the harness's wrapper: not shown
                wanted.discard(self.repro.spec.repro.script)
            return [name for name in files if name in wanted]
        return closure.needed(files, roots, configs)

    def code(self, wanted: Sequence[str] | None = None) -> list[Section]:
        """The repro's script first, then the other files of `wanted` (default: every file
        read) and the fixes. A file a shown command needs is dropped to fit a comment only
        after the environment reports, and its stub names it."""
        sections = []
        for rank, found in enumerate(self.files.sources):
            if wanted is not None and found.shown not in wanted:
                continue
            lines = len(found.text.splitlines())
            sections.append(
                Section(
                    md.details(
                        f"{md.html_code(found.shown)} ({lines} lines)",
                        md.fence(found.text, found.lang),
                    ),
                    drop=2 if rank == 0 else 3,
                    stub=f"*{md.code(found.shown)} ({lines} lines, {len(found.text):,} "
                    "characters) is not shown: with it the comment would pass GitHub's 65,536 "
                    f"characters. Save it beside the others from {FILES_PLACE}.*",
                    source=found.path,
                    shown=found.shown,
                )
            )
        return sections

    # -- what happened

    def results(self) -> list[Section]:
        """The results table, the rule, the matrix and the measurements (`results`)."""
        return results.results(self)

    def not_run_section(self) -> Section:
        """Cells that never ran, and later runs that measured nothing (an interrupt, an
        error, an install that failed) while an earlier run of the cell measured the verdict
        shown: each with its time, under one heading; none of them is a verdict."""
        if not (self.not_run or self.later):
            return Section("")
        lines = ["### Not run"]
        if self.not_run:
            lines += [
                "",
                "These cells never ran (bad input, an install that failed, an interrupt), so "
                "they say nothing about the bug:",
                "",
                *(
                    f"- {md.code(r.label)}: {md.text(r.reason or 'no reason recorded')} "
                    f"({md.text(r.started_at or 'time not recorded')})"
                    for r in self.not_run
                ),
            ]
        if self.later:
            measured = {(r.platform, r.label): r.started_at for r in self.records}
            lines += [
                "",
                "Later runs that measured nothing; the verdicts above are from the earlier "
                "runs that did:",
                "",
                *(
                    f"- {md.code(r.label)} at {md.text(r.started_at or 'an unrecorded time')}: "
                    f"{md.text(r.reason or 'no reason recorded')} (the verdict shown was "
                    f"measured at {md.text(measured.get((r.platform, r.label), '?'))})"
                    for r in self.later
                ),
            ]
        return Section("\n".join(lines))

    def problems(self, bisect_skipped: Sequence[str]) -> Section:
        """Cells that ran and did not end as expected, with their log tails."""
        lines = []
        for record in self.ran:
            if record.status not in (Status.ERROR, Status.MISMATCH):
                continue
            tail = self.files.log_tails.get(log_dir(record), "")
            body = md.text(record.reason or "no reason recorded")
            if tail:
                body += "\n\n" + md.fence(tail)
            mark = _MARK[record.status]
            lines.append(md.details(f"{mark} {md.html_code(record.label)}", body))
        for skipped in [*self.skipped, *bisect_skipped]:
            lines.append(f"- skipped {md.text(skipped)}")
        if not lines:
            return Section("")
        return Section("### Problems\n\n" + "\n\n".join(lines), drop=1, stub="")

    # -- the environment

    def environment(self, env: Environment | None, gathered: bool) -> list[Section]:
        sections = [Section("### Environment")]
        if env is None:
            why = (
                "`--no-env` was given"
                if not gathered
                else "the environment the runs used is no longer on this machine"
            )
            sections.append(Section(f"*The environment reports were not run: {why}.*"))
        else:
            labels = env.labels
            if len(labels) > 4:
                shown = ", ".join(md.code(x) for x in labels[:4]) + f" and {len(labels) - 4} more"
            else:
                shown = names(labels)
            where = f"In the environment of {shown}:"
            sections.append(Section(where))
            missing = []
            for report in env.reports:
                if report.text:
                    trimmed = " (trimmed)" if "collect_env" in report.title else ""
                    summary = md.html_code(report.title) + trimmed
                    sections.append(
                        Section(
                            md.details(summary, md.fence(report.text)),
                            drop=4,
                            stub=f"*{md.code(report.title)} omitted here for length.*",
                        )
                    )
                else:
                    missing.append(f"{md.code(report.title)}: {md.text(report.note)}")
            if env.absent:
                missing.append(f"{names(env.absent)} (not installed)")
            if missing:
                sections.append(Section("Reports not gathered: " + "; ".join(missing) + "."))
        machine = machine_table(self.ran)  # kernel, CPU, GPUs, NCCL, /dev/shm, image, ...
        if machine:
            sections.append(Section(machine, drop=2, stub=""))
        differing = self._differing_versions()
        if differing:
            sections.append(Section(differing))
        return sections

    def _differing_versions(self) -> str:
        """Packages whose version differs between the cells (the rest is in the reports)."""
        versions: dict[str, dict[str, list[str]]] = {}
        for record in self.ran:
            for package, version in versions_of(record).items():
                versions.setdefault(package, {}).setdefault(str(version), []).append(record.label)
        rows = []
        for package in sorted(versions):
            if len(versions[package]) < 2:
                continue
            for version, labels in versions[package].items():
                shown = ", ".join(md.code(x) for x in labels[:4])
                if len(labels) > 4:
                    shown += f" and {len(labels) - 4} more"
                rows.append([md.text(package), md.text(version), shown])
        if not rows:
            return ""
        return "Versions that differ between cells:\n\n" + md.table(
            ["package", "version", "cells"], rows
        )

    # -- the rest

    def title(self) -> Section:
        s = self.repro.spec.repro
        lines = [f"# {md.text(s.title)}", "", f"Upstream: {s.upstream}"]
        if s.fix_links:  # a paragraph of its own: markdown joins adjacent lines into one
            lines += ["", "Fixes and related: " + ", ".join(s.fix_links)]
        return Section("\n".join(lines))

    def plots_section(self, made: Sequence[tuple[str, Path]], out: Path) -> Section:
        if not made:
            return Section("")
        lines = ["### Plots", ""]
        for caption, path in made:
            lines += [f"![{md.text(caption)}]({path.relative_to(out).as_posix()})", ""]
        return Section("\n".join(lines).rstrip())

    def footer(self, comment: bool) -> Section:
        """Where this came from; in a comment on the upstream issue, no link back to it."""
        s = self.repro.spec.repro
        stamp = self.files.generated
        about = f"reprobox repro {md.code(self.repro.name)}"
        if comment and not self._posting_to_upstream():
            about += f" of {md.link(s.title, s.upstream)}"
        left = f", {self.left_out} left out by --only/--since" if self.left_out else ""
        related = ""
        if comment and s.fix_links:
            related = " Related: " + ", ".join(s.fix_links) + "."
        return Section(
            f"<sub>{about}: {_count(len(self.records), 'cell')}{left}, generated {stamp}."
            f"{related}</sub>"
        )

    def _posting_to_upstream(self) -> bool:
        if not self.posting_to:
            return False
        ref = issue_ref(self.repro.spec.repro.upstream)
        repo, _, number = self.posting_to.partition("#")
        return ref is not None and ref == (repo.lower(), int(number or 0))


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
