"""An upstream-ready report of a repro, built only from the records on disk.

`write_report` reads the newest record of every cell (and any bisect summary), and writes
`report.md` (GitHub-flavoured: verdicts, key metrics, bisect result, commands to reproduce,
environment and the repro's code in `<details>`), `comment.md` (the same, sized and worded for
an issue comment, which cannot carry images), `results.json` (the records merged) and the
plots under `plots/`. Every string passes through `scrub.Scrubber` on its way out. The report
is built in a temporary folder and swapped in whole, so a failure leaves the previous one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from reprobox.bisect.summary import BisectSummary, read_summaries
from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.core.records import (
    RECORD_SCHEMA,
    ForeignRecord,
    Record,
    RecordStore,
)
from reprobox.report import plots
from reprobox.report.scrub import Scrubber, looks_secret

REPORT_DIR = "_report"
BISECT_DIR = "_bisect"
MARKER = ".reprobox-report"  # marks a folder this module wrote (and may replace)
COMMENT_LIMIT = 65_000  # GitHub refuses comment bodies over 65,536 characters
EXTRA_METRICS = 3  # headline metrics shown beside the ones the verdict rule reads
MAX_ENVS = 4  # distinct environments whose collect_env output is gathered
LOG_TAIL_LINES = 40

_MARK = {"match": "✅", "mismatch": "❌", "error": "⚠️", "recorded": "ℹ️"}


class ReportError(BadInput):
    """The records cannot make a report (none, foreign, unreadable) or the output is unsafe."""


@dataclass
class Loaded:
    records: list[Record]
    skipped: list[str] = field(default_factory=list)  # "path: why", one per unusable file


@dataclass(frozen=True)
class ReportOptions:
    out: Path | None = None  # default: results/<repro>/_report
    results: Path | None = None  # the results folder (default: <checkout>/results)
    collect_env: bool = True  # run torch's collect_env with each environment's interpreter
    env_timeout: float = 180.0


@dataclass
class Report:
    dir: Path
    markdown: Path
    comment: Path
    results: Path
    plots: list[Path]
    records: int
    skipped: list[str]


# ---- reading


def load_records(store: RecordStore, name: str) -> Loaded:
    """The newest readable record of every cell of `name`, by the store's one rule (the
    table shows the same ones).

    A half-written record is skipped for the next older run of its cell, and named in the
    report; a record of another repro under this repro's folder is an error."""
    base = store.repro_dir(name)
    if not base.is_dir():
        raise ReportError(f"no results for {name} under {base}; run `reprobox run {name}` first")
    try:
        records, skipped = store.scan(name)
    except ForeignRecord as exc:
        raise ReportError(str(exc)) from None
    loaded = Loaded(records, skipped)
    if not loaded.records:
        extra = f" ({len(loaded.skipped)} unreadable)" if loaded.skipped else ""
        raise ReportError(f"no usable records for {name} under {base}{extra}")
    return loaded


def bisect_summaries(store: RecordStore, name: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every `_bisect/*/summary.json` of `name`, newest first, and the unreadable ones
    (read through the bisect's own model, so the report and the bisect agree on fields)."""
    found, skipped = read_summaries(store.repro_dir(name) / BISECT_DIR)
    return [{**s.model_dump(mode="json"), "id": s.id} for s in found], skipped


def order_records(records: Sequence[Record], variants: Sequence[str]) -> list[Record]:
    """Default cells first in repro.toml's variant order, then the matrix, then platform."""
    rank = {v: i for i, v in enumerate(variants)}

    def key(r: Record) -> tuple[bool, int, str, str, str]:
        axes = bool(r.packages or r.params)
        return (axes, rank.get(r.variant, len(rank)), r.variant, str(r.packages), str(r.params))

    return sorted(records, key=lambda r: (*key(r), r.platform))


def key_metrics(records: Sequence[Record], rule_metrics: Sequence[str]) -> list[str]:
    """The rule's metrics, then up to EXTRA_METRICS headline ones: metrics whose values
    separate reproduced from clean runs first, then any that vary; constants never."""
    rules = list(dict.fromkeys(rule_metrics))
    names = [m for r in records for m in r.metrics if m not in rules]
    separating, varying = [], []
    for name in dict.fromkeys(names):
        values = [(r.verdict, r.metrics[name]) for r in records if name in r.metrics]
        if len({v for _, v in values}) < 2:
            continue
        hit = [v for verdict, v in values if verdict == "reproduced"]
        clean = [v for verdict, v in values if verdict == "clean"]
        if hit and clean and (min(hit) > max(clean) or max(hit) < min(clean)):
            separating.append(name)
        else:
            varying.append(name)
    return rules + (separating + varying)[:EXTRA_METRICS]


def charted_metrics(metrics: Sequence[str], rule_metrics: Sequence[str]) -> list[str]:
    """The bar charts: the rule's first metric (it decides), and the first headline one
    (often the readable one, e.g. lm_head / mean)."""
    extra = [m for m in metrics if m not in rule_metrics]
    return list(dict.fromkeys([*list(rule_metrics)[:1], *extra[:1]]))


# ---- the environment


def interpreter(record: Record) -> Path | None:
    """The repro environment's python: the launcher recorded in `command` lives beside it."""
    if not record.command:
        return None
    python = Path(record.command[0]).parent / "python"
    return python if python.is_absolute() and python.exists() else None


def collect_env(records: Sequence[Record], timeout: float) -> list[tuple[list[str], str]]:
    """torch's own `python -m torch.utils.collect_env`, once per distinct environment (at most
    MAX_ENVS), as (cells, output); identical outputs are merged."""
    by_python: dict[Path, list[str]] = {}
    for record in records:
        python = interpreter(record)
        if python is not None:
            by_python.setdefault(python, []).append(record.label)
    env = {k: v for k, v in os.environ.items() if not looks_secret(k)}
    outputs: dict[str, list[str]] = {}
    for python, labels in list(by_python.items())[:MAX_ENVS]:
        with tempfile.TemporaryDirectory() as cwd:
            try:
                proc = subprocess.run(
                    [str(python), "-m", "torch.utils.collect_env"],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    cwd=cwd,
                    env=env,
                )
                text = proc.stdout.strip() or proc.stderr.strip()
                if proc.returncode != 0:
                    text = f"collect_env exited {proc.returncode}:\n{text[-2000:]}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                text = f"collect_env could not run: {exc}"
        outputs.setdefault(text, []).extend(labels)
    return [(labels, text) for text, labels in outputs.items()]


# ---- markdown helpers


def _fence(text: str, lang: str = "") -> str:
    """A code block whose fence is longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def _dq(text: str) -> str:
    """Shell-quote for reading: double quotes where they are safe, else shlex."""
    return f'"{text}"' if not re.search(r'["$`\\!]', text) else shlex.quote(text)


def _few(labels: Sequence[str], shown: int = 4, code: bool = True) -> str:
    """The first few labels and how many more: a version table stays readable at 100 cells."""
    names = ", ".join(f"`{x}`" if code else x for x in labels[:shown])
    return names + (f" and {len(labels) - shown} more" if len(labels) > shown else "")


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else ""


@dataclass
class _Section:
    """A piece of the report; `drop` > 0 may be shortened to fit a comment (highest first)."""

    text: str
    drop: int = 0
    stub: str = ""


# ---- the report


class _Builder:
    def __init__(self, root: Path, repro: spec.Repro, loaded: Loaded, scrub: Scrubber) -> None:
        self.root, self.repro, self.scrub = root, repro, scrub
        variants = list(repro.spec.variants)
        self.variants = variants
        self.records = order_records(loaded.records, variants)
        self.skipped = list(loaded.skipped)
        # The metrics every cell's own rule reads (a variant may have its own [verdict]).
        shown = dict.fromkeys(r.variant for r in self.records)
        self.rules = list(dict.fromkeys(rule.metric for v in shown for rule in _rules_of(repro, v)))
        self.metrics = key_metrics(self.records, self.rules)
        self.platforms = len({r.platform for r in self.records})

    # -- sections

    def header(self) -> _Section:
        s = self.repro.spec.repro
        lines = [f"# {s.title}", "", f"Upstream: {s.upstream}"]
        if s.fix_links:
            lines.append("Fixes and related: " + ", ".join(s.fix_links))
        counts: dict[str, int] = {}
        for record in self.records:
            counts[record.status] = counts.get(record.status, 0) + 1
        total = len(self.records)
        if counts.get("match", 0) + counts.get("recorded", 0) == total:
            verdict = f"All {total} cells gave the verdict they were expected to give."
        else:
            off = total - counts.get("match", 0) - counts.get("recorded", 0)
            verdict = (
                f"**{off} of {total} cells did not give the expected verdict** "
                f"({counts.get('mismatch', 0)} mismatched, "
                f"{counts.get('error', 0)} without a verdict)."
            )
        lines += ["", verdict, ""]
        for record in self.records:
            if record.packages or record.params:
                continue
            description = self.repro.spec.variants.get(record.variant)
            said = (
                f" ({description.description})" if description and description.description else ""
            )
            shown = ", ".join(
                f"{m}={_fmt(record.metrics[m])}" for m in self.rules if m in record.metrics
            )
            lines.append(
                f"- {_MARK.get(record.status, '')} `{record.label}`{said}: "
                f"**{record.verdict or 'error'}**, expected {record.expect}"
                + (f" - {shown}" if shown else "")
                + (f" - {record.reason}" if record.status == "error" else "")
            )
        return _Section("\n".join(lines))

    def verdicts(self) -> _Section:
        """Variants across, matrix points down."""
        points = list(dict.fromkeys(plots.point_label(r, self.platforms) for r in self.records))
        present = [v for v in self.variants if any(r.variant == v for r in self.records)]
        rows = []
        for point in points:
            row: list[object] = [point]
            for variant in present:
                found = [
                    r
                    for r in self.records
                    if r.variant == variant and plots.point_label(r, self.platforms) == point
                ]
                if not found:
                    row.append("")
                    continue
                r = found[0]
                shown = f"{_MARK.get(r.status, '')} {r.verdict or 'error'}"
                if r.status in ("mismatch", "error"):
                    shown += f" (expected {r.expect})"
                row.append(shown)
            rows.append(row)
        legend = "✅ as expected · ❌ not as expected · ⚠️ error (no verdict) · ℹ️ recorded only"
        return _Section("## Verdicts\n\n" + _table(["cell", *present], rows) + f"\n\n{legend}")

    def metrics_table(self) -> _Section:
        header = ["cell", "expected", "verdict", *self.metrics, "wall s"]
        if self.platforms > 1:
            header.insert(1, "platform")
        rows = []
        for r in self.records:
            row: list[object] = [f"`{r.label}`", r.expect, r.verdict or "error"]
            row += [_fmt(r.metrics.get(m)) for m in self.metrics]
            row.append(f"{r.wall_s:.1f}")
            if self.platforms > 1:
                row.insert(1, r.platform)
            rows.append(row)
        intro = _rules_intro(self.repro, [r.variant for r in self.records])
        runs = [
            [
                f"`{r.label}`",
                r.platform,
                r.result.get("device", ""),
                r.result.get("backend", ""),
                r.result.get("world_size", ""),
                r.result.get("python", ""),
                r.result.get("seed", ""),
                r.started_at,
                r.reason,
            ]
            for r in self.records
        ]
        run_table = _table(
            ["cell", "platform", "device", "backend", "ranks", "python", "seed", "started", "why"],
            runs,
        )
        return _Section(
            f"## Metrics\n\n{intro}\n\n{_table(header, rows)}\n\n"
            + _details("Runs: device, backend, ranks, seed, reason", run_table)
        )

    def plots_section(self, made: list[tuple[str, Path]], out: Path) -> _Section:
        if not made:
            return _Section("")
        lines = ["## Plots", ""]
        for caption, path in made:
            lines += [f"![{caption}]({path.relative_to(out).as_posix()})", ""]
        return _Section("\n".join(lines).rstrip())

    def bisect(self, summaries: list[dict[str, Any]]) -> _Section:
        if not summaries:
            return _Section("")
        lines = ["## Bisect", ""]
        for number, data in enumerate(summaries):
            summary = BisectSummary.model_validate(data)
            body = f"**{summary.result}**"
            doubts = self._bisect_doubts(summary)
            if doubts:
                body += "\n\n" + doubts
            body += "\n\n" + self._bisect_facts(summary)
            probes = summary.probes
            probe_table = _table(
                ["probe", "verdict", "wall s"],
                [
                    [
                        p.item + "".join(f" ({t})" for t in p.tags),
                        p.verdict or "skip",
                        _fmt(p.wall_s),
                    ]
                    for p in probes
                ],
            )
            if probes:
                body += "\n\n" + _details(f"{len(probes)} probes", probe_table)
            if number == 0:
                lines += [body, ""]
            else:
                kind = "sweep" if summary.kind == "sweep" else "bisect"
                lines += [_details(f"Earlier {kind} {data.get('id', '')}", body), ""]
        return _Section("\n".join(lines).rstrip())

    @staticmethod
    def _bisect_facts(summary: BisectSummary) -> str:
        if summary.kind == "sweep":
            events = ", ".join(
                f"introduced {e.introduced}" if e.introduced is not None else f"fixed {e.fixed}"
                for e in summary.events
            )
            return _table(
                ["package", "range", "affected", "events", "untested"],
                [
                    [
                        summary.package or "",
                        summary.range or "",
                        summary.affected or "none",
                        events,
                        ", ".join(summary.untested),
                    ]
                ],
            )
        if summary.kind == "date":
            return _table(
                ["status", "days (UTC)", "first", "new that day", "culprit"],
                [
                    [
                        summary.status,
                        f"{summary.start}..{summary.end}",
                        summary.first or "",
                        "; ".join(summary.released_on_day),
                        ", ".join(summary.culprit),
                    ]
                ],
            )
        yanked = set(summary.yanked)
        return _table(
            ["status", "package", "good", "bad", "first", "candidates"],
            [
                [
                    summary.status,
                    summary.package or "",
                    summary.good or "",
                    summary.bad or "",
                    summary.first or "",
                    ", ".join(f"{c} (yanked)" if c in yanked else c for c in summary.candidates),
                ]
            ],
        )

    def _bisect_doubts(self, summary: BisectSummary) -> str:
        """Why a bisect's answer is not certain: contradictions it found, and verdicts of
        this report's own records (which may be newer than the bisect) that contradict it."""
        lines = [
            f"- {summary.package or ''} {c.item}: {c.verdict.value} ({c.source}), "
            f"the answer implies {c.expected.value}"
            for c in summary.contradictions
        ]
        if summary.kind == "release" and summary.status in ("found", "ambiguous"):
            known = [
                (dict(r.packages)[k], Verdict(r.verdict), f"the {r.label} cell of this report")
                for r in self.records
                for k in r.packages
                if len(r.packages) == 1
                and canonicalize_name(k) == summary.package
                and r.variant == summary.variant
                and r.platform == summary.platform
                and not r.params
                and r.verdict in (Verdict.CLEAN.value, Verdict.REPRODUCED.value)
            ]
            against, _ = summary.contradicted_by(known)
            if against:
                lines = [
                    "**Not certain:** records in this report contradict this answer, so the "
                    "verdict changes more than once in the range (run `reprobox sweep`):",
                    *(
                        f"- {summary.package} {c.item}: {c.verdict.value} ({c.source}), "
                        f"the answer implies {c.expected.value}"
                        for c in against
                    ),
                    *lines,
                ]
        return "\n".join(lines)

    def commands(self) -> _Section:
        name = self.repro.name
        defaults = [r for r in self.records if not (r.packages or r.params)]
        matrix = [r for r in self.records if r.packages or r.params]
        harness = [f'nox -s "repro_{name}(default)"    # every default variant, verdict table']
        for variant in dict.fromkeys(r.variant for r in defaults):
            harness.append(f"reprobox run {name} --variant {variant}")
        lines = [
            "## Reproduce",
            "",
            "With the harness, from a checkout of this repository:",
            "",
            _fence("\n".join(harness), "sh"),
        ]
        if matrix:
            cells = "\n".join(
                f"nox -s {_dq(self.session_id(r))}\n"
                f"reprobox run {name} {shlex.join(self.run_args(r))}"
                for r in matrix
            )
            lines += [
                "",
                _details(f"The {len(matrix)} matrix cells, one by one", _fence(cells, "sh")),
            ]
        launched = []
        for r in defaults or self.records[:1]:
            if not r.command:
                continue
            env = self.lock_line(r)
            launched.append(f"# {r.label}{env}\n{self.portable_command(r)}")
        if launched:
            lines += [
                "",
                "Without the harness: the launcher command each run used (from the checkout root, "
                "in that environment; `REPRO_RESULT` names where the result JSON goes):",
                "",
                _fence("\n\n".join(launched), "sh"),
            ]
        if matrix and any(r.command for r in matrix):
            recorded = "\n\n".join(
                f"# {r.label}\n{self.portable_command(r)}" for r in matrix if r.command
            )
            lines += ["", _details("Launcher commands of the matrix cells", _fence(recorded, "sh"))]
        images = [
            f"nox -s image -- {name} --variant {v}"
            + (" --platform gpu" if any(r.platform == "gpu" for r in self.records) else "")
            + " --run"
            for v in dict.fromkeys(r.variant for r in defaults)
        ]
        if images:
            lines += ["", "In the pinned container image:", "", _fence("\n".join(images), "sh")]
        return _Section("\n".join(lines))

    def session_id(self, record: Record) -> str:
        return record.cell().session_id

    @staticmethod
    def run_args(record: Record) -> list[str]:
        return record.cell().run_args()

    def lock_line(self, record: Record) -> str:
        """Where the run's environment comes from: a committed lock, or the pins."""
        candidates = [Path(record.lock)] if record.lock else []
        if not record.packages:
            candidates.append(self.repro.dir / "locks" / f"{record.variant}.{record.platform}.txt")
        for lock in candidates:
            try:
                shown = lock.relative_to(self.root)
            except ValueError:
                continue
            if lock.is_file():
                return f" - environment: `uv pip sync {shown.as_posix()}`"
        pins = ", ".join(f"{k}=={v}" for k, v in record.packages.items())
        return " - environment: the pins of repro.toml" + (f" with {pins}" if pins else "")

    def portable_command(self, record: Record) -> str:
        """The recorded command with the environment's bin dir dropped and checkout paths
        made relative, prefixed by the environment the harness set."""
        argv = list(record.command)
        argv[0] = Path(argv[0]).name
        for i, arg in enumerate(argv):
            if arg.startswith("/"):
                try:
                    argv[i] = str(Path(arg).relative_to(self.root))
                except ValueError:
                    pass
        env = {"REPRO_RESULT": "result.json", "PYTHONPATH": "fixes"}
        try:
            env.update(self.repro.launch(record.variant).env)
        except BadInput:
            pass  # a variant since removed from repro.toml: its command is still the record
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"{prefix} {shlex.join(argv)}"

    def environment(self, envs: list[tuple[list[str], str]]) -> list[_Section]:
        sections = [_Section("## Environment")]
        if envs:
            for labels, text in envs:
                cells = (
                    "all cells" if len(labels) == len(self.records) else _few(labels, code=False)
                )
                sections.append(
                    _Section(
                        _details(
                            f"<code>python -m torch.utils.collect_env</code> ({cells})",
                            _fence(text),
                        ),
                        drop=3,
                        stub="*collect_env output omitted here for length; see report.md.*",
                    )
                )
        else:
            sections.append(
                _Section(
                    "*torch's collect_env was not run: no record names an environment that is "
                    "still on this machine (or `--no-env` was given).*"
                )
            )
        versions: dict[str, dict[str, list[str]]] = {}
        for record in self.records:
            for package, version in (record.result.get("versions") or {}).items():
                versions.setdefault(package, {}).setdefault(str(version), []).append(record.label)
        rows = []
        for package in sorted(versions):
            for version, labels in versions[package].items():
                having = sum(1 for r in self.records if package in (r.result.get("versions") or {}))
                cells = "all" if len(labels) == having else _few(labels)
                rows.append([package, version, cells])
        if rows:
            sections.append(
                _Section(
                    _details(
                        "Package versions the runs imported",
                        _table(["package", "version", "cells"], rows),
                    )
                )
            )
        return sections

    def code(self) -> list[_Section]:
        """The repro's script first, then its other files and the fixes its variants use."""
        repro_dir = self.repro.dir
        sections = [_Section("## The repro")]
        main = self.repro.script
        files = [main, repro_dir / spec.SPEC_FILE]
        files += sorted(
            p
            for p in repro_dir.iterdir()
            if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".json") and p != main
        )
        fixes = {v.fix for v in self.repro.spec.variants.values() if v.fix}
        files += [self.repro.fixes_dir / f"{fix}.py" for fix in sorted(fixes)]
        for rank, path in enumerate(files):
            try:
                text = path.read_text()
            except OSError:
                continue
            shown = self._shown(path)
            lang = {".py": "python", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}.get(
                path.suffix, ""
            )
            sections.append(
                _Section(
                    _details(f"<code>{shown}</code>", _fence(text, lang)),
                    drop=2 if rank == 0 else 4,
                    stub=f"*`{shown}` omitted here for length; see report.md or the repository.*",
                )
            )
        return sections

    def problems(self, bisect_skipped: list[str]) -> _Section:
        lines = []
        for record in self.records:
            if record.status not in ("error", "mismatch"):
                continue
            log_dir = Path(record.batch_dir or record.dir)
            tail = _tail(log_dir / "launch.log", LOG_TAIL_LINES)
            body = f"{record.reason or 'no reason recorded'}"
            if tail:
                body += "\n\n" + _fence(tail)
            lines.append(_details(f"{_MARK[record.status]} <code>{record.label}</code>", body))
        for skipped in [*self.skipped, *bisect_skipped]:
            lines.append(f"- skipped {skipped}")
        if not lines:
            return _Section("")
        return _Section("## Problems\n\n" + "\n\n".join(lines), drop=1, stub="")

    def footer(self) -> _Section:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        return _Section(
            f"<sub>reprobox report of `{self.repro.name}`, {len(self.records)} cells, "
            f"generated {stamp}.</sub>"
        )

    def _shown(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return path.name


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _join(sections: Sequence[_Section]) -> str:
    return "\n\n".join(s.text for s in sections if s.text).rstrip() + "\n"


def fit(sections: list[_Section], limit: int) -> list[_Section]:
    """Shorten the droppable sections, least essential first, until the text fits `limit`."""
    sections = list(sections)
    for level in sorted({s.drop for s in sections if s.drop > 0}, reverse=True):
        if len(_join(sections)) <= limit:
            break
        sections = [_Section(s.stub) if s.drop == level else s for s in sections]
    return sections


def comment_text(sections: list[_Section], plot_paths: Sequence[str], artifact: str) -> str:
    """The report as an issue comment: images become a list of files (gh cannot attach them),
    and the whole fits GitHub's size limit."""
    footer = ["", "---"]
    if plot_paths:
        footer.append(
            f"Plots are not attached: `gh` cannot upload images to a comment. They are in "
            f"{artifact}:"
        )
        footer += [f"- `{p}`" for p in plot_paths]
    tail = "\n".join(footer) + "\n"
    body = [
        _Section(re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r"*Plot: \1 - `\2`*", s.text), s.drop, s.stub)
        for s in sections
    ]
    body = fit(body, COMMENT_LIMIT - len(tail))
    return _join(body) + tail


def artifact_hint() -> str:
    """Where a reader finds the PNGs: this CI run's artifacts, or the report folder."""
    server, repo, run = (
        os.environ.get("GITHUB_SERVER_URL"),
        os.environ.get("GITHUB_REPOSITORY"),
        os.environ.get("GITHUB_RUN_ID"),
    )
    if server and repo and run:
        return f"the artifacts of {server}/{repo}/actions/runs/{run}"
    return "the report folder next to report.md"


# ---- writing


def _rules_of(repro: spec.Repro, variant: str) -> list[spec.Rule]:
    try:
        return repro.rules(variant)
    except BadInput:  # a variant since removed from repro.toml: the repro's rule
        return list(repro.spec.verdict.reproduced_if)


def _rules_intro(repro: spec.Repro, variants: Sequence[str]) -> str:
    """Which rule decided which cells: the repro's, and each variant's own where it has one."""

    def text(rules: list[spec.Rule]) -> str:
        return ", ".join(f"`{rule.metric} > {rule.above:g}`" for rule in rules)

    own = {v: _rules_of(repro, v) for v in dict.fromkeys(variants)}
    base = list(repro.spec.verdict.reproduced_if)
    lines = [f"Reproduced when any of {text(base)} holds (repro.toml `[verdict] reproduced_if`)"]
    for variant, rules in own.items():
        if rules != base:
            lines.append(f"`{variant}`: its own rule, {text(rules)}")
    return "; ".join(lines) + "."


def default_out(results: Path, name: str) -> Path:
    return results / name / REPORT_DIR


def _check_out(out: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file()):
        raise ReportError(f"{out} exists and is not a reprobox report; choose another --out")


def write_report(
    root: Path,
    name: str,
    options: ReportOptions = ReportOptions(),
    progress: Callable[[str], None] = lambda message: None,
    scrubber: Scrubber | None = None,
) -> Report:
    """Build the report of `name` from the records on disk and swap it into its folder."""
    repro = spec.load(root, name)
    store = RecordStore(options.results or root / "results")
    out = (options.out or default_out(store.base, name)).absolute()
    _check_out(out)
    loaded = load_records(store, name)
    scrub = scrubber or Scrubber()
    summaries, bisect_skipped = bisect_summaries(store, name)
    builder = _Builder(root, repro, loaded, scrub)
    progress(f"report {name}: {len(builder.records)} cells, {len(summaries)} bisect(s)")

    out.parent.mkdir(parents=True, exist_ok=True)
    # `_`: never read as a cell folder while it exists
    tmp = out.with_name(f"_tmp-{out.name.lstrip('_')}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        progress("plots")
        made = _plots(builder, tmp, scrub.text)
        envs: list[tuple[list[str], str]] = []
        if options.collect_env:
            progress("collect_env in each environment (a few seconds each)")
            envs = [
                (labels, scrub.text(text))
                for labels, text in collect_env(builder.records, options.env_timeout)
            ]
        sections = [
            builder.header(),
            builder.verdicts(),
            builder.metrics_table(),
            builder.plots_section(made, tmp),
            builder.bisect(summaries),
            builder.commands(),
            *builder.environment(envs),
            *builder.code(),
            builder.problems(bisect_skipped),
            builder.footer(),
        ]
        sections = [_Section(scrub.text(s.text), s.drop, scrub.text(s.stub)) for s in sections]
        (tmp / "report.md").write_text(_join(sections))
        plot_paths = [p.relative_to(tmp).as_posix() for _, p in made]
        comment = comment_text(sections, plot_paths, artifact_hint())
        (tmp / "comment.md").write_text(scrub.text(comment))
        merged = {
            "schema": RECORD_SCHEMA,
            "repro": name,
            "title": repro.spec.repro.title,
            "upstream": repro.spec.repro.upstream,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "records": [r.to_json() for r in builder.records],
            "bisect": summaries,
            "skipped": [*builder.skipped, *bisect_skipped],
        }
        (tmp / "results.json").write_text(json.dumps(scrub.data(merged), indent=2) + "\n")
        (tmp / MARKER).write_text("written by reprobox report; replaced by the next one\n")
        _swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Report(
        dir=out,
        markdown=out / "report.md",
        comment=out / "comment.md",
        results=out / "results.json",
        plots=[out / p.relative_to(tmp) for _, p in made],
        records=len(builder.records),
        skipped=[*builder.skipped, *bisect_skipped],
    )


def _plots(builder: _Builder, out: Path, text: Callable[[str], str]) -> list[tuple[str, Path]]:
    made = []
    for metric in charted_metrics(builder.metrics, builder.rules):
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", metric)[:80]
        path = out / "plots" / f"metric_{slug}.png"
        bars = plots.metric_bars(builder.records, metric, path, builder.variants, text)
        if bars is not None:
            made.append((text(f"{metric} per cell"), bars))
    made += plots.series_plots(builder.records, out / "plots", builder.variants, text)
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
