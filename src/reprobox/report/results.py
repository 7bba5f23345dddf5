"""The results of a report (`sections.Builder.results`): one table of the default cells
(variant, verdict, the deciding metrics), the rule once, the matrix collapsed, and the
measurements of cells expected `unknown`. Pure: data in, sections out."""

from __future__ import annotations

import shlex

from reprobox.core import repeat_verdict, spec
from reprobox.core.judge import Status
from reprobox.report import markdown as md
from reprobox.report import plots
from reprobox.report.facts import Facts
from reprobox.report.markdown import Section
from reprobox.report.metric_text import shown

MAX_METRIC_COLUMNS = 3  # the results table stays inside a comment's column
MARK = {"match": "✅", "mismatch": "❌", "error": "⚠️", "recorded": "ℹ️"}


def results(b: Facts) -> list[Section]:
    """One table of the default cells (variant, verdict, the deciding metrics), the
    variants' descriptions once, the rule once; the matrix collapsed."""
    sections = []
    extra = [m for m in b.metrics if m not in b.rules]
    metrics = [*b.rules, *extra[:1]][:MAX_METRIC_COLUMNS]
    if b.judged:
        rows = []
        for r in b.judged:
            verdict = f"{MARK.get(r.status, '')} {r.verdict or r.status}"
            if r.stat is not None:  # repeated launches: mean ± CI and n, not one number
                verdict += f" ({md.text(repeat_verdict.summary(r.stat))})"
            if r.status in (Status.MISMATCH, Status.ERROR, Status.UNDECIDED):
                verdict += f" (expected {r.expect})"
            rows.append([md.code(r.label), verdict, *(shown(r.metrics, m) for m in metrics)])
        header = ["variant", "verdict", *(md.code(m) for m in metrics)]
        if b.platforms > 1:
            header.insert(1, "platform")
            for row, r in zip(rows, b.judged, strict=True):
                row.insert(1, md.text(r.platform))
        described = [
            f"- {md.code(r.label)}: {md.text(b._description(r.variant))}"
            for r in b.judged
            if b._description(r.variant)
        ]
        text = "### Results\n\n" + md.table(header, rows)
        text += "\n\n" + rule_line(b)
        if described:
            text += "\n\n" + "\n".join(dict.fromkeys(described))
        sections.append(Section(text))
    if b.matrix:
        sections.append(Section(matrix_table(b), drop=2, stub=""))
    if b.measured:
        sections.append(measurements(b))
    return sections


def measurements(b: Facts) -> Section:
    """Cells expected `unknown`: what they measured, per group, and the script's own
    conclusion from those numbers. Recorded, not judged: no verdict, no pass or fail."""
    blocks = [
        "### Measurements",
        "Recorded, not judged (expect `unknown`): the figures and the conclusion are the "
        "script's own.",
    ]
    for record, found in b.measured:
        where = f" on {md.text(record.platform)}" if b.platforms > 1 else ""
        about = b._description(record.variant)
        head = f"{md.code(record.label)}{where}" + (f": {md.text(about)}" if about else "")
        rows = [
            [md.text(row.group), str(row.n), f"{row.mean:+.4g} ± {row.se:.2g}",
             f"{row.fraction_negative:.1%}", f"{row.z:+.2f}"]
            for row in found.rows
        ]  # fmt: skip
        what = f"Measured: {md.text(found.name)}.\n\n" if found.name else ""
        table = md.table(["", "n", "mean ± SE", "negative", "z = mean / SE"], rows)
        said = f"**Conclusion:** {md.text(found.conclusion)}"
        blocks.append(f"{head}\n\n{what}{table}\n\n{said}")
    return Section("\n\n".join(blocks))


def rule_line(b: Facts) -> str:
    def spelled(rules: list[spec.Rule]) -> str:
        return " or ".join(f"{md.code(r.metric)} > {r.above:g}" for r in rules)

    base = list(b.repro.spec.verdict.reproduced_if)
    line = f"Reproduced when {spelled(base)} (the script computes it; repro.toml's rule)."
    own = [
        f"{md.code(v)}: {spelled(b._rules(v))}"
        for v in dict.fromkeys(r.variant for r in b.ran if not b._is_measured(r))
        if b._rules(v) != base
    ]
    return line + (" Own rules: " + "; ".join(own) + "." if own else "")


def matrix_table(b: Facts) -> str:
    points = list(dict.fromkeys(plots.point_label(r, b.platforms) for r in b.matrix))
    present = [v for v in b.variants if any(r.variant == v for r in b.matrix)]
    rows = []
    for point in points:
        row = [md.text(point)]
        for variant in present:
            found = [
                r
                for r in b.matrix
                if r.variant == variant and plots.point_label(r, b.platforms) == point
            ]
            if not found:
                row.append("")
                continue
            r = found[0]
            shown = f"{MARK.get(r.status, '')} {r.verdict or 'error'}"
            if r.status in ("mismatch", "error"):
                shown += f" (expected {r.expect})"
            row.append(shown)
        rows.append(row)
    table = md.table(["cell", *(md.code(v) for v in present)], rows)
    cmds = "\n".join(
        f"reprobox run {b.repro.name} {shlex.join(r.cell().run_args())}" for r in b.matrix
    )
    body = table + "\n\n" + md.fence(cmds, "sh")
    cells = len(b.matrix)
    return md.details(f"Matrix: {cells} cell{'s' * (cells != 1)}", body)
