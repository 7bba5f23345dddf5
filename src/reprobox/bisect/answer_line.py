"""The one line a bisect ends with, said like git bisect's: what it found, how sure, and what
it assumed (a boundary, candidates, a flaky or non-monotone refusal), from its summary.
The summary's model and files are bisect.summary's; this module only words them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from reprobox.bisect.summary import BisectSummary, Event
from reprobox.core.protocol import Verdict


def events_line(events: Sequence[Event], versions: Sequence[str] = ()) -> str:
    """`introduced 4.44.2, fixed 4.46.0, ...` (OSV's event order); a bound says so:
    `introduced at or before 2.18.0 (the range's first release)`, `fixed after 1.1, at or
    before 1.3 (untested between)`, `still reproduces at 3.0.0, the range's last release`."""
    first = versions[0] if versions else None
    last = versions[-1] if versions else None
    parts: list[str] = []
    for e in events:
        if e.last_affected is not None:
            edge = "the range's last release" if e.last_affected == last else "the last tested"
            parts.append(f"still reproduces at {e.last_affected}, {edge}")
            continue
        word, name = (
            ("introduced", e.introduced) if e.introduced is not None else ("fixed", e.fixed)
        )
        if not e.bound:
            parts.append(f"{word} {name}")
        elif e.after is None:
            edge = "the range's first release" if name == first else "untested before it"
            parts.append(f"{word} at or before {name} ({edge})")
        else:
            parts.append(f"{word} after {e.after}, at or before {name} (untested between)")
    return ", ".join(parts)


def verdict_word(verdict: Verdict | str | None) -> str:
    """ "clean" / "reproducing", as the answer line says it."""
    return "clean" if verdict == Verdict.CLEAN.value else "reproducing"


def assumption(noun: str, ends: tuple[str, str], probed: int, total: int, extra: str = "") -> str:
    """What a bisect's answer rests on, said with the answer."""
    between = f"assuming one change between {ends[0]} and {ends[1]}"
    return f"{between}; {probed} of {total} {noun}s probed{extra}"


def kept_posterior(p: float) -> float:
    """A posterior as a summary keeps it: floored to 4 places, so 0.99996 is never 1.0."""
    return math.floor(p * 10_000) / 10_000


def shown_posterior(p: float) -> str:
    """A posterior as a line shows it, never rounded up to a certainty it is not: 0.9996 is
    "> 0.999", not "1.000"."""
    return "> 0.999" if p >= 0.9995 else f"{math.floor(p * 1000) / 1000:.3f}"


def _tallies(summary: BisectSummary) -> list[str]:
    """Each item that disagreed with itself, with its count: `4.48.0 (reproduced in 1 of 2
    launches)`, from the probes the summary keeps."""
    shown = []
    for item in summary.flaky:
        verdicts = [p.verdict for p in summary.probes if p.item == item and p.verdict]
        hits = sum(v == "reproduced" for v in verdicts)
        shown.append(
            f"{item} (reproduced in {hits} of {len(verdicts)} launches)" if verdicts else item
        )
    return shown


def answer(
    summary: BisectSummary,
    noun: str,
    subject: str,
    ends: tuple[str, str],
    *,
    detail: str = "",
    suggest: str = "",
) -> str:
    """The one line a bisect ends with, like git bisect's, saying what it assumed.

    `subject` prefixes item names ("trl "); `detail` goes before the assumption (a date
    bisect's "UTC; new that day: ..."); `suggest` follows an answer that is not certain."""
    kind = verdict_word(summary.end_verdict)
    yanked = set(summary.yanked)

    def named(item: str) -> str:
        return f"{item} (yanked)" if item in yanked else item

    if summary.status == "flaky":
        return (
            f"flaky: {subject}{', '.join(_tallies(summary))} gave different verdicts when "
            "repeated; no boundary claimed (the outcome is noisy: rerun with --flaky, or "
            "declare [verdict] repeats)"
        )
    if summary.status == "non-monotone":
        listed = ", ".join(
            f"{subject}{named(c.item)} {'is clean' if c.verdict is Verdict.CLEAN else 'reproduces'}"
            f" ({c.source})"
            for c in summary.contradictions
        )
        return (
            f"non-monotone: {listed}, against the bisect's answer (first {kind} {noun}: "
            f"{subject}{summary.first}); the verdict changes more than once between "
            f"{ends[0]} and {ends[1]}, so no boundary is claimed (if the outcome is noisy, "
            f"rerun with --flaky){suggest}"
        )
    if summary.status == "found":
        core = f"first {kind} {noun}: {subject}{summary.first}"
        if summary.first in yanked:
            core += f", a yanked {noun}"
        if summary.last_start in yanked:
            start_kind = verdict_word(summary.start_verdict)
            core += f", right after {summary.last_start} ({start_kind}, yanked)"
    else:
        core = f"first {kind} {noun} could be any of: {subject}"
        core += ", ".join(named(c) for c in summary.candidates)
    inside = "; ".join(part for part in (detail, summary.assumption) if part)
    return f"{core} ({inside})" if inside else core
