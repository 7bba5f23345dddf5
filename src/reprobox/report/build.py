"""An upstream-ready report of a repro, built only from the records on disk.

`write_report` reads the newest record of every cell (`data`), any bisect or sweep summary,
gathers the stack's environment reports in the environment the bug's cell ran in
(`environment`), and writes, from the same sections (`sections`):

- `comment.md`: what a maintainer reads first, sized for an issue comment (which cannot
  carry images: the plots are named only by a CI run's artifacts link, see `plot_note`):
  the result with versions and the metric (or the bisect's answer), the expected behaviour,
  a minimal reproduction, results, what did not run, the environment;
- `report.md`: the same with a title and the plots, for the repository or an artifact;
- `report.html`: report.md as one file with the plots embedded;
- `results.json` (the records merged) and `plots/`.

Every string passes through `scrub.Scrubber` on its way out, and text from scripts passes
through `markdown` (no mention, no markup). The report is built in a temporary folder and
swapped in whole, so a failure leaves the previous one. Under CI, comment.md is added to
the job's summary (`$GITHUB_STEP_SUMMARY`, when the caller passes it).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from reprobox.bisect.summary import BisectSummary
from reprobox.core import scaffold, spec
from reprobox.core.errors import BadInput
from reprobox.core.records import RECORD_SCHEMA, RecordStore
from reprobox.core.scrub import Scrubber
from reprobox.report import html, plots
from reprobox.report.data import (
    Loaded,
    ReportError,
    Selection,
    bisect_summaries,
    charted_metrics,
    key_metrics,
    load_records,
    not_run,
    order_records,
)
from reprobox.report.env_commands import Environment, gather
from reprobox.report.files import read_files
from reprobox.report.markdown import Section
from reprobox.report.sections import Builder

__all__ = [
    "COMMENT_LIMIT",
    "OMITTED_DIR",
    "OMITTED_FILE",
    "Loaded",
    "Report",
    "ReportError",
    "ReportOptions",
    "Section",
    "charted_metrics",
    "comment_text",
    "files_line",
    "fit",
    "key_metrics",
    "load_records",
    "not_run",
    "order_records",
    "with_files_link",
    "write_report",
]

REPORT_DIR = "_report"
MARKER = ".reprobox-report"  # marks a folder this module wrote (and may replace)
OMITTED_FILE = "comment-omitted.json"  # the repro files the comment had no room for
OMITTED_DIR = "files"  # their scrubbed copies, what `--post` publishes (paths relative)
COMMENT_LIMIT = 65_000  # GitHub refuses comment bodies over 65,536 characters
STEP_SUMMARY_LIMIT = 1_000_000  # GitHub's limit per step is 1 MiB
# kept free for the line naming where the files left out are (`files_line`, a gist URL)
FILES_LINK_ROOM = 1_000


def comment_marker(name: str) -> str:
    """The hidden line `--edit-last` finds its previous comment by."""
    return f"<!-- reprobox-report: {name} -->"


@dataclass(frozen=True)
class ReportOptions:
    out: Path | None = None  # default: results/<repro>/_report
    results: Path | None = None  # the results folder (default: <checkout>/results)
    collect_env: bool = True  # run the environment reports with the environment's python
    env_timeout: float = 120.0  # per report command
    only: tuple[str, ...] = ()  # cells to keep: labels or variants (shell patterns)
    since: datetime | None = None  # keep cells started at or after this instant
    posting_to: str | None = None  # "owner/repo#N": the comment leaves out a link to it
    step_summary: Path | None = None  # $GITHUB_STEP_SUMMARY: comment.md is appended there
    ci_run_url: str | None = None  # the CI run whose artifacts hold report.html and the plots
    # runs that measured nothing (a typo, an interrupt, an install that failed) are the
    # reporter's business: in report.md/.html always, in comment.md only when asked
    comment_not_run: bool = False


@dataclass
class Report:
    dir: Path
    markdown: Path
    comment: Path
    html: Path
    results: Path
    plots: list[Path]
    records: int
    skipped: list[str]
    not_run: int = 0


def _join(sections: Sequence[Section]) -> str:
    return "\n\n".join(s.text for s in sections if s.text).rstrip() + "\n"


def fit(sections: list[Section], limit: int) -> list[Section]:
    """Shorten the droppable sections, least essential first, until the text fits `limit`;
    then put back, in the order they went, those that fit again (an environment report
    dropped before a needed file made the room)."""
    original = list(sections)
    sections = list(sections)
    dropped: list[int] = []
    for level in sorted({s.drop for s in sections if s.drop > 0}, reverse=True):
        # within a level the largest goes first, one at a time: a small file a shown command
        # needs (a launcher config) stays inline while a big one makes the room
        order = sorted(
            (i for i, s in enumerate(sections) if s.drop == level),
            key=lambda i: -len(sections[i].text),
        )
        for i in order:
            if len(_join(sections)) <= limit:
                break
            sections[i] = replace(sections[i], text=sections[i].stub, stub="", omitted=True)
            dropped.append(i)
        if len(_join(sections)) <= limit:
            break
    for i in dropped[:-1]:  # the last one dropped is the one that made it fit
        kept = sections[i]
        sections[i] = original[i]
        if len(_join(sections)) > limit:
            sections[i] = kept
    return sections


def omitted_files(sections: Sequence[Section]) -> list[tuple[str, Path]]:
    """The repro files a comment's sections left out to fit: (name shown, the file)."""
    return [(s.shown, s.source) for s in sections if s.omitted and s.source is not None]


def comment_text(sections: list[Section], note: str, marker: str = "") -> str:
    """The sections as an issue comment, `note` (where the plots are, if anywhere) after
    them, the whole within GitHub's size limit."""
    return comment_parts(sections, note, marker)[0]


def comment_parts(
    sections: list[Section], note: str, marker: str = ""
) -> tuple[str, list[Section]]:
    """The comment's text and the sections as fitted (which files were left out)."""
    tail = (f"\n{note}\n" if note else "") + (f"\n{marker}\n" if marker else "")
    fitted = comment_fit(sections, tail)
    return _join(fitted) + tail, fitted


def comment_fit(sections: list[Section], tail: str) -> list[Section]:
    """The comment's sections, image links out, shortened to fit with `tail` after them."""
    body = [replace(s, text=re.sub(r"!\[[^\]]*\]\([^)]+\)", "", s.text)) for s in sections]
    return fit(body, COMMENT_LIMIT - FILES_LINK_ROOM - len(tail))


def files_line(names: Sequence[str], url: str = "") -> str:
    """The comment's line naming where the files it could not hold are: the secret gist
    `--post` makes, or, until it is made, a line saying the link is still to come (a
    comment.md posted by hand would otherwise send a maintainer nowhere)."""
    listed = ", ".join(f"`{n}`" for n in names)
    if url:
        return f"*The files not shown above ({listed}) are in a secret gist: {url}*\n"
    return (
        f"*The files not shown above ({listed}): their link is added here when the report is "
        "posted (`reprobox report --post`, which publishes them as a secret gist).*\n"
    )


def with_files_link(comment: str, url: str, names: Sequence[str]) -> str:
    """The comment, with a line saying where the files it could not hold are published
    (before its hidden marker, which stays last): it replaces the line saying the link is
    still to come."""
    line = files_line(names, url)
    pending = files_line(names)
    if pending in comment:
        return comment.replace(pending, line)
    marker = comment.rfind("\n<!-- reprobox-report")
    if marker < 0:
        return comment.rstrip("\n") + "\n\n" + line
    return comment[: marker + 1] + "\n" + line + comment[marker:]


def plot_note(plots: int, ci_run_url: str | None) -> str:
    """The comment's line about the plots. An issue comment cannot carry them (`gh` uploads
    no image), so they are named only where the reader can open them: the artifacts of the
    CI run that made the report (the settings name it, read at the CLI's edge). Elsewhere
    they are on the reporter's disk only, and the comment does not mention them."""
    if not plots or not ci_run_url:
        return ""
    return f"*report.html, with {plots} plots embedded, is in the artifacts of {ci_run_url}.*"


def default_out(results: Path, name: str) -> Path:
    return results / name / REPORT_DIR


def _check_out(out: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file()):
        raise ReportError(f"{out} exists and is not a reprobox report; choose another --out")


def _environment(builder: Builder, options: ReportOptions, repro: spec.Repro) -> Environment | None:
    """The reports in the environment of the bug's cell (the others differ only in the
    versions the report lists apart)."""
    bug = builder.bug_record()
    if bug is None:
        return None
    try:
        extra = dict(repro.launch(bug.variant).env)
        pins = repro.requirements(bug.variant, bug.platform)
    except BadInput:  # a variant since removed from repro.toml
        extra, pins = {}, list(repro.spec.env.pins)
    same = [r.label for r in builder.ran if r.command[:1] == bug.command[:1]]
    return gather(bug, pins, extra, options.env_timeout, same)


def write_report(
    root: Path,
    name: str,
    options: ReportOptions = ReportOptions(),
    progress: Callable[[str], None] = lambda message: None,
    scrubber: Scrubber | None = None,
) -> Report:
    """Build the report of `name` from the records on disk and swap it into its folder."""
    repro = spec.load(root, name)
    left = scaffold.placeholders(repro.spec)
    if left:
        raise ReportError(
            f"repros/{name}/repro.toml still holds what `reprobox new` wrote ({', '.join(left)}); "
            "say what the bug is and where it is reported before reporting it"
        )
    store = RecordStore(options.results or root / "results")
    out = (options.out or default_out(store.base, name)).absolute()
    _check_out(out)
    summaries, bisect_skipped = bisect_summaries(store, name)
    selection = Selection(options.only, options.since)
    loaded = load_records(store, name, selection, answers=len(summaries))
    scrub = scrubber or Scrubber()
    files = read_files(repro, loaded.records)
    builder = Builder(repro, loaded, files, summaries, options.posting_to)
    upstream = builder if options.comment_not_run else _measured_only(builder, loaded)
    progress(f"report {name}: {len(builder.records)} cells, {len(summaries)} bisect(s)")

    out.parent.mkdir(parents=True, exist_ok=True)
    # `_`: never read as a cell folder while it exists
    tmp = out.with_name(f"_tmp-{out.name.lstrip('_')}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        progress("plots")
        made = _plots(builder, summaries, tmp, scrub.text)
        env = None
        if options.collect_env:
            progress("environment reports (transformers env, collect_env, ...)")
            env = _environment(builder, options, repro)
        head = [builder.headline(), builder.expected(), *builder.reproduction()]
        # the comment goes to a maintainer without reprobox: no hint to run it
        comment_head = [
            upstream.headline(),
            upstream.expected(),
            *upstream.reproduction(bundle_hint=False),
        ]
        results = builder.results()
        rest = [
            builder.not_run_section(),
            builder.problems(bisect_skipped),
            builder.bisect_details(),
            *builder.environment(env, options.collect_env),
        ]
        comment_rest = [
            upstream.not_run_section(),
            upstream.problems(bisect_skipped),
            upstream.bisect_details(),
            *upstream.environment(env, options.collect_env),
        ]
        report_sections = [
            builder.title(),
            *head,
            *results,
            builder.plots_section(made, tmp),
            *rest,
            builder.footer(comment=False),
        ]
        report_sections = [_scrubbed(s, scrub) for s in report_sections]
        report_md = _join(report_sections)
        (tmp / "report.md").write_text(report_md)
        (tmp / "report.html").write_text(html.render(report_md, tmp, repro.spec.repro.title))
        note = plot_note(len(made), options.ci_run_url)
        comment_body = [
            *comment_head,
            *upstream.results(),
            *comment_rest,
            upstream.footer(comment=True),
        ]
        comment_sections = [_scrubbed(s, scrub) for s in comment_body]
        comment, fitted = comment_parts(comment_sections, scrub.text(note), comment_marker(name))
        omitted = []
        for shown, path in omitted_files(fitted):  # beside the report, so a CI artifact of
            kept = Path(OMITTED_DIR) / shown  # the folder alone is enough to post it
            (tmp / kept).parent.mkdir(parents=True, exist_ok=True)
            (tmp / kept).write_text(scrub.text(path.read_text()))
            omitted.append({"name": shown, "path": kept.as_posix()})
        if omitted:
            comment = with_files_link(comment, "", [item["name"] for item in omitted])
        (tmp / "comment.md").write_text(comment)
        (tmp / OMITTED_FILE).write_text(json.dumps(omitted, indent=1) + "\n")
        merged = {
            "schema": RECORD_SCHEMA,
            "repro": name,
            "title": repro.spec.repro.title,
            "upstream": repro.spec.repro.upstream,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "records": [r.to_json() for r in builder.records],
            "not_run": [r.label for r in builder.not_run],
            "bisect": [{**s.model_dump(mode="json"), "id": s.id} for s in summaries],
            "skipped": [*builder.skipped, *bisect_skipped],
        }
        (tmp / "results.json").write_text(json.dumps(scrub.data(merged), indent=2) + "\n")
        (tmp / MARKER).write_text("written by reprobox report; replaced by the next one\n")
        _swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if options.step_summary is not None:
        _append_step_summary(options.step_summary, comment)
    return Report(
        dir=out,
        markdown=out / "report.md",
        comment=out / "comment.md",
        html=out / "report.html",
        results=out / "results.json",
        plots=[out / p.relative_to(tmp) for _, p in made],
        records=len(builder.records),
        skipped=[*builder.skipped, *bisect_skipped],
        not_run=len(builder.not_run),
    )


def _measured_only(builder: Builder, loaded: Loaded) -> Builder:
    """The report's builder without the runs that measured nothing (cells that never ran,
    later runs after the verdict shown): what upstream reads is about the bug. A repro
    with no measured cell at all keeps them, so the comment still says what happened."""
    measured = [r for r in loaded.records if not not_run(r)]
    if not measured:
        return builder
    kept = replace(loaded, records=measured, later=[])
    return Builder(builder.repro, kept, builder.files, builder.summaries, builder.posting_to)


def _scrubbed(section: Section, scrub: Scrubber) -> Section:
    return replace(section, text=scrub.text(section.text), stub=scrub.text(section.stub))


def _append_step_summary(path: Path, comment: str) -> None:
    """GitHub shows the step summary on the run's page; each step's file is appended to."""
    text = comment if len(comment) < STEP_SUMMARY_LIMIT else comment[:STEP_SUMMARY_LIMIT]
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text.rstrip() + "\n\n")


def _plots(
    builder: Builder, summaries: Sequence[BisectSummary], out: Path, text: Callable[[str], str]
) -> list[tuple[str, Path]]:
    made = []
    for metric in charted_metrics(builder.metrics, builder.rules):
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", metric)[:80]
        path = out / "plots" / f"metric_{slug}.png"
        bars = plots.metric_bars(builder.ran, metric, path, builder.variants, text)
        if bars is not None:
            made.append((text(f"{metric} per cell"), bars))
    made += plots.series_plots(builder.ran, out / "plots", builder.variants, text)
    made += plots.release_plots(builder.ran, summaries, out / "plots", builder.variants, text)
    return made


def _swap(new: Path, out: Path) -> None:
    """Put `new` at `out`; an earlier report there (and only a report) is replaced."""
    if not out.exists():
        new.rename(out)
        return
    _check_out(out)
    old = out.with_name(f"_old-{out.name.lstrip('_')}-{uuid.uuid4().hex[:8]}")
    out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)
