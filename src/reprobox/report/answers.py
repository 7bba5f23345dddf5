"""The report's answers: the headline (what the sweeps, bisects and the bug's cell say) and
the bisect details behind it, for the maintainer who fixes the bug.

The "Affected" line is built from every verdict on disk for its configuration (`affected`),
never from one sweep's own summary, and its edges are bounds unless two adjacent releases
were probed: "introduced at or before X (the range's first release)", never "in X".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from packaging.utils import canonicalize_name

from reprobox.bisect.summary import BisectSummary, CommitDetails, Contradiction, ReleaseDetails
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record
from reprobox.report import affected
from reprobox.report import markdown as md
from reprobox.report.facts import Facts
from reprobox.report.markdown import Section

# Where a package's releases are tagged: (GitHub repo, tag prefix), for compare links.
RELEASE_REPOS = {
    "torch": ("pytorch/pytorch", "v"),
    "transformers": ("huggingface/transformers", "v"),
    "accelerate": ("huggingface/accelerate", "v"),
    "trl": ("huggingface/trl", "v"),
    "peft": ("huggingface/peft", "v"),
    "datasets": ("huggingface/datasets", ""),
    "tokenizers": ("huggingface/tokenizers", "v"),
    "safetensors": ("huggingface/safetensors", "v"),
    "huggingface-hub": ("huggingface/huggingface_hub", "v"),
    "deepspeed": ("deepspeedai/DeepSpeed", "v"),
    "numpy": ("numpy/numpy", "v"),
}


def compare_link(package: str | None, older: str, newer: str) -> str | None:
    """The GitHub compare view between two releases of a known package."""
    known = RELEASE_REPOS.get(canonicalize_name(package or ""))
    if known is None:
        return None
    repo, prefix = known
    return f"https://github.com/{repo}/compare/{prefix}{older}...{prefix}{newer}"


def names(labels: Sequence[str]) -> str:
    shown = [md.code(x) for x in labels]
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def affected_line(found: affected.ReleaseMap) -> str:
    """One configuration's affected releases, every edge an event or a bound, the evidence
    counted, and any release measured both ways named (no event is claimed next to it)."""
    package, _variant, _platform, others = found.config
    name = md.text(package) + "".join(f" (with {md.text(k)} {md.text(v)})" for k, v in others)
    probed = found.probed()
    spans = found.spans()
    if not spans:
        line = f"**Sweep:** none of the {len(probed)} probed releases of {name} reproduces"
    else:
        ranges = " and ".join(
            md.code(f"=={s.first}" if s.first == s.last else f">={s.first},<={s.last}")
            for s in spans
        )
        events = [_edge(package, e) for s in spans for e in (s.start, s.end)]
        line = f"**Affected:** {name} {ranges} - " + ", ".join(events)
    counted = ", ".join(
        f"{n} {kind}{'' if n == 1 else 's'}"
        for kind in ("sweep", "bisect", "cell")
        if (n := found.sources.get(kind, 0))
    )
    untested = f"; {len(found.untested)} untested" if found.untested else ""
    line += f" ({len(probed)} of {len(found.releases)} releases probed: {counted}{untested})."
    conflicts = found.conflicts()
    if conflicts:
        line += " **Not certain:** " + "; ".join(
            f"{md.text(release)} gave "
            + " and ".join(f"{s.verdict.value} ({md.text(s.source)})" for s in seen)
            for release, seen in conflicts.items()
        )
        line += "; no change is claimed next to them."
    return line


def _edge(package: str, edge: affected.Edge) -> str:
    """ "introduced in B" only between adjacent probed releases; otherwise a bound."""
    verb = edge.kind
    if edge.at is not None and edge.after is not None:
        text = f"{verb} in {md.text(edge.at)}"
        link = compare_link(package, edge.after, edge.at) if verb == "fixed" else None
        return text + (f" ({md.link(f'{edge.after}...{edge.at}', link)})" if link else "")
    if edge.after is not None and edge.before is not None:
        return f"{verb} after {md.text(edge.after)}, at or before {md.text(edge.before)}"
    if verb == "introduced":
        which = "range's first release" if edge.first_of_range else "first release probed"
        return f"introduced at or before {md.text(edge.before or '')} (the {which})"
    which = "range's last release" if edge.first_of_range else "last release probed"
    return f"fixed after {md.text(edge.after or '')}, if at all (the {which})"


def headline(b: Facts) -> Section:
    """The first lines: for each configuration a sweep mapped, the releases affected as every
    verdict on disk says (`affected`); the newest answer of each other kind of bisect (a
    commit answer beside the release answer it narrowed); then the result of the bug's cell
    with its versions and what the script measured."""
    maps = {
        config: affected.release_map(config, b.summaries, b.ran)
        for config in affected.configs(b.summaries)
    }
    lines = [affected_line(found) for found in maps.values()]
    newest: dict[str, BisectSummary] = {}
    for summary in b.summaries:  # newest first
        if summary.kind != "sweep":
            newest.setdefault(summary.kind, summary)
    for summary in newest.values():
        if _said_by(maps, summary):
            continue  # a sweep's Affected line already gives this answer
        against = measured_against(b, summary)
        line = conflict_line(summary, against) if against else bisect_headline(summary)
        lines += [line] if line else []
    lines.append(result_line(b))
    return Section("\n\n".join(lines))


_THROUGHOUT = re.compile(r"^no change in the range: (?P<word>reproducing|clean) throughout ")


def throughout(summary: BisectSummary) -> Verdict | None:
    """The verdict a "no change" answer claims for every release of its range (its closing
    line says which: `no change in the range: reproducing throughout ...`)."""
    found = _THROUGHOUT.match(summary.result) if summary.status == "no-change" else None
    if found is None:
        return None
    return Verdict.REPRODUCED if found["word"] == "reproducing" else Verdict.CLEAN


def measured_against(b: Facts, summary: BisectSummary) -> list[tuple[Contradiction, Record]]:
    """The measured cells this report shows that contradict a release bisect's answer (a
    boundary, "found" or "ambiguous": each side's verdict; "no change": one verdict
    throughout the range) or a sweep's map (each release as its probes found it), each with
    the cell that measured it. Other answers claim no verdict of a release (flaky,
    non-monotone, undecided), and a date or commit bisect's items are not the cells'
    releases."""
    if summary.kind not in ("release", "sweep"):
        return []
    measured = affected.measured_releases(summary, b.ran)
    cell_of = {f"the {r.label} cell of this report": r for _, _, r in measured}
    known = [(ran, verdict, f"the {r.label} cell of this report") for ran, verdict, r in measured]
    if summary.kind == "release" and summary.status in ("found", "ambiguous"):
        against, _ = summary.contradicted_by(known)
        return [(c, cell_of[c.source]) for c in against]
    claimed = throughout(summary)
    if summary.kind == "sweep":  # each release as its probes map it
        said = {
            affected.version_key(p.item): Verdict(p.verdict) for p in summary.probes if p.verdict
        }
    elif claimed is not None:
        said = {affected.version_key(v): claimed for v in summary.versions}
    else:
        return []
    return [
        (
            Contradiction(item=ran, verdict=verdict, expected=wanted, source=where),
            cell_of[where],
        )
        for ran, verdict, where in known
        if (wanted := said.get(affected.version_key(ran))) is not None and verdict is not wanted
    ]


def conflict_line(summary: BisectSummary, against: Sequence[tuple[Contradiction, Record]]) -> str:
    """A bisect's answer that a cell of this report contradicts: both named, neither the
    headline ("the bisect's answer ... conflicts with the measured cell ...: see both")."""
    cells = "; ".join(
        f"the measured cell {md.code(record.label)} ({md.text(summary.package or '')} "
        f"{md.text(c.item)} {c.verdict.value}{_how(record)}, where the answer implies "
        f"{c.expected.value})"
        for c, record in against
    )
    return (
        f"**Conflict:** the {summary.kind} bisect's answer ({md.text(summary.result)}) "
        f"conflicts with {cells}: see both (the bisect's probes below, the cells under "
        "*Results*); neither is claimed here."
    )


def _how(record: Record) -> str:
    """` by a one-sample t-test over 40 launches`: how a noisy cell was decided."""
    stat = record.stat or {}
    test, n = stat.get("test"), stat.get("n")
    if not isinstance(test, str) or not isinstance(n, int):
        return ""
    return f" by {md.text(test.split(' (')[0])} over {n} launches"


def result_line(b: Facts) -> str:
    bug = b.bug_record()
    if bug is None and not b.records:  # a report of sweeps and bisects alone
        return (
            "**No cell measured:** the answers above come from the sweeps and bisects on "
            "disk alone (their probes below)."
        )
    if bug is None:
        return f"**No verdict:** none of the {len(b.records)} cells ran (see *Not run* below)."
    facts = ", ".join(b.versions(bug))
    result = bug.result
    ranks = result.get("world_size")
    setup = [str(x) for x in (result.get("backend"), result.get("device")) if x]
    if ranks:
        facts += (
            (", " if facts else "") + f"{ranks} ranks" + (f" ({', '.join(setup)})" if setup else "")
        )
    word = {
        "reproduced": "Reproduced",
        "clean": "Not reproduced",
        "cannot_test": "Cannot test here",
    }.get(bug.verdict or "", "No verdict")
    if bug.verdict == Verdict.CLEAN and bug.expect != Verdict.REPRODUCED:
        word = "Clean"
    if bug.status == Status.RECORDED:
        word = "Measured"
    said = md.text(bug.reason or (result.get("reason") or ""))
    line = f"**{word}** with {md.text(facts)}" if facts else f"**{word}**"
    line += f": {md.code(bug.label)}"
    line += f" - {said}" if said else ""
    if bug.status == Status.MISMATCH:
        line += f" (expected {bug.expect})"
    if bug.status == Status.ERROR:
        line += " (no verdict; see *Problems*)"
    line += "."
    after = [r for r in b.later if (r.platform, r.label) == (bug.platform, bug.label)]
    if after:
        line += (
            f" Measured at {md.text(bug.started_at)}; {len(after)} later run"
            f"{' measured' if len(after) == 1 else 's measured'} nothing (see *Not run*)."
        )
    others = [r for r in b.judged if r is not bug]
    as_expected = [r for r in others if r.status in (Status.MATCH, Status.RECORDED)]
    by_verdict: dict[str, list[str]] = {}
    for r in as_expected:
        by_verdict.setdefault(r.verdict or "error", []).append(r.label)
    parts = [
        f"{names(labels)} {'is' if len(labels) == 1 else 'are'} {verdict.replace('_', ' ')}"
        for verdict, labels in by_verdict.items()
    ]
    if parts:
        line += " " + "; ".join(parts) + ", as expected."
    off = [r for r in others if r.status not in (Status.MATCH, Status.RECORDED)]
    if off:
        line += (
            " **Not as expected:** "
            + "; ".join(
                f"{md.code(r.label)} gave {r.verdict or 'no verdict'} (expected {r.expect})"
                for r in off
            )
            + "."
        )
    measured = [r.label for r, _ in b.measured if r is not bug]
    if measured:
        line += f" {names(measured)} recorded a measurement (see *Measurements*)."
    return line


def _said_by(maps: dict[affected.Config, affected.ReleaseMap], summary: BisectSummary) -> bool:
    """A release bisect whose answer an "Affected" line of its configuration already gives
    as an event (the same release, the same compare link): one line says it, not two."""
    found = maps.get(affected.config_of(summary))
    if found is None or summary.kind != "release" or summary.status != "found":
        return False
    last = summary.last_start or ""
    return any(
        edge.at == summary.first and edge.after == last
        for span in found.spans()
        for edge in (span.start, span.end)
    )


def bisect_headline(summary: BisectSummary) -> str:
    """A release, date or commit bisect's answer as one line a maintainer acts on."""
    package = summary.package or ""
    status = summary.status
    asked = summary.details
    commit = asked.commit if isinstance(asked, CommitDetails) else None
    if commit is not None and status == "found":
        sha = md.code(commit.sha[:12])
        shown = md.link(commit.sha[:12], commit.link) if commit.link else sha
        what = "Fixed in commit" if summary.end_verdict == Verdict.CLEAN else "First bad commit"
        line = f"**{what}:** {shown} {md.text(commit.subject)}"
        if commit.pr_link and commit.pr:
            line += f" ({md.link(f'#{commit.pr}', commit.pr_link)})"
        return line + "."
    known_sides = summary.start_verdict in (Verdict.REPRODUCED, Verdict.CLEAN)
    if isinstance(asked, ReleaseDetails) and status == "found" and summary.first and known_sides:
        last = summary.last_start or asked.bad or asked.good or ""
        fixed = summary.start_verdict == Verdict.REPRODUCED
        verb = "Fixed" if fixed else "Introduced"
        if fixed:
            side = f"{md.text(last)} is the last release that reproduces, " + (
                f"{md.text(summary.first)} the first clean one"
            )
        else:
            side = f"{md.text(last)} is the last clean release, " + (
                f"{md.text(summary.first)} the first that reproduces"
            )
        link = compare_link(package, last, summary.first) if last else None
        tail = f" ({md.link(f'compare {last}...{summary.first}', link)})" if link else ""
        return f"**{verb} in {md.text(package)} {md.text(summary.first)}:** {side}{tail}."
    said = md.text(summary.result or f"{summary.kind} ended {status}")
    return f"**{summary.kind.capitalize()} ({md.text(status)}):** {said}"


def bisect_details(b: Facts) -> Section:
    """The probes and facts behind the headline's answer, collapsed."""
    if not b.summaries:
        return Section("")
    blocks = []
    for number, summary in enumerate(b.summaries):
        rows = [
            [md.text(p.item + "".join(f" ({t})" for t in p.tags)), p.verdict or "skip",
             md.number(p.wall_s)]
            for p in summary.probes
        ]  # fmt: skip
        body = md.text(summary.result) if summary.result else ""
        doubted = doubts(b, summary)
        if doubted:
            body += "\n\n" + doubted
        if summary.assumption:
            body += "\n\n" + md.text(summary.assumption)
        if rows:
            body += "\n\n" + md.table(["probe", "verdict", "wall s"], rows)
        kind = summary.kind
        of = f"of {md.html_text(summary.package)}" if summary.package else ""
        title = f"{kind.capitalize()} {of}"
        title += f" ({md.html_text(summary.status)}, {len(summary.probes)} probes)"
        if number > 0:
            title = "Earlier: " + title
        blocks.append(md.details(title.strip(), body.strip() or "no probes recorded"))
    return Section("\n\n".join(blocks), drop=2, stub="")


def doubts(b: Facts, summary: BisectSummary) -> str:
    """Why an answer is not certain: its own contradictions, and records of this report
    (which may be newer) that contradict it."""
    lines = [
        f"- {md.text(summary.package or '')} {md.text(c.item)}: {c.verdict.value} "
        f"({md.text(c.source)}), the answer implies {c.expected.value}"
        for c in summary.contradictions
    ]
    against = [c for c, _ in measured_against(b, summary)]
    if against:
        lines = [
            "**Not certain:** records in this report contradict this answer: the verdict "
            "changes more than once in the range, or the outcome is noisy (run `reprobox "
            "sweep`, or declare `[verdict] repeats` and bisect with `--flaky`):",
            *(
                f"- {md.text(summary.package or '')} {md.text(c.item)}: {c.verdict.value} "
                f"({md.text(c.source)}), the answer implies {c.expected.value}"
                for c in against
            ),
            *lines,
        ]
    return "\n".join(lines)
