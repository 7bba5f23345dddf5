"""The flake-aware strategy under the driver: `bisect.flaky`'s posterior search, on real probes.

Every probe outcome is evidence: reproduced or clean feeds the posterior, cannot-test skips the
candidate, anything else stops the bisect (the prober's rule). A re-probe of a candidate is a
new run (the next attempt: its own run folder, its own line in the probe log). The search is
deterministic given its observations, so a bisect run again after `kill -9` replays the log's
probes in the same order and goes on where it stopped. The answer is then held against every
verdict on disk for the range: they are more observations of the same candidates, and the
answer stands only if the posterior with them still gives it at the target confidence.

The posterior assumes the later side reproduces; with the good end newer than the bad one (a
fix), the candidates are searched newest first and the answer is turned back to version order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from reprobox.bisect.answer_line import kept_posterior, shown_posterior, verdict_word
from reprobox.bisect.axes import Context
from reprobox.bisect.flaky import FlakyAnswer, Observation, flaky_search
from reprobox.bisect.outcome import Checked, Outcome
from reprobox.bisect.summary import BisectSummary
from reprobox.core.protocol import Verdict

T = TypeVar("T")
SHOWN = 5  # candidates an undecided answer names


def search(context: Context[T]) -> Outcome[T]:
    """Probe by expected information until the target confidence or the run budget."""
    axis, prober, strategy = context.axis, context.prober, context.strategy
    question = context.question
    items = list(question.candidates)
    observations: list[Observation[T]] = []
    if question.good is not None and question.bad is not None:
        newest_first = items.index(question.good) > items.index(question.bad)
    else:  # no side named (days): which way the ends go, from one probe of each
        ends = prober.probe_all([(items[0], 1), (items[-1], 1)], strategy.workers)
        observations = [(items[0], _seen(ends[0])), (items[-1], _seen(ends[1]))]
        newest_first = ends[0] is Verdict.REPRODUCED and ends[1] is Verdict.CLEAN
    order = items[::-1] if newest_first else items
    workers = strategy.workers

    def batch(jobs: list[tuple[T, int]]) -> list[Verdict | None]:
        return prober.probe_all(jobs, workers)

    mine = flaky_search(
        order, prober, confidence=strategy.confidence, max_runs=strategy.max_runs,
        workers=workers, observations=observations, probe_batch=batch if workers > 1 else None,
    )  # fmt: skip
    known, unread = context.on_disk()
    outcome = Outcome(flaky=mine, newest_first=newest_first, unread=unread)
    key = question.key
    where = {key(axis.name(item)): item for item in items}
    disk: list[Observation[T]] = [
        (where[key(name)], verdict is Verdict.REPRODUCED)
        for name, verdict, _ in known
        if key(name) in where
    ]
    if not disk:
        return outcome
    both = flaky_search(
        order, None, confidence=strategy.confidence, max_runs=0,
        observations=[*mine.observations, *disk],
    )  # fmt: skip
    same = (both.status, both.culprit) == (mine.status, mine.culprit)
    holds = mine.status != "undecided" and same and both.confidence >= strategy.confidence
    return replace(
        outcome, checked=Checked(len(disk), holds, both, undecided=mine.status == "undecided")
    )


def _seen(verdict: Verdict | None) -> bool | None:
    return None if verdict is None else verdict is Verdict.REPRODUCED


def summarize(context: Context[T], outcome: Outcome[T]) -> BisectSummary:
    """The summary of a flake-aware search: status found, no-change or undecided, the
    posterior, the runs and the counts per candidate, and the closing line. Candidates are
    named as the answer names them: the first item of the end side, in version order."""
    question, flaky = context.question, outcome.flaky
    assert flaky is not None
    held = outcome.checked
    counted = held is not None and (held.moved or held.undecided)  # answer from all of them
    answer: FlakyAnswer[T] = held.answer if held is not None and counted else flaky
    newest_first = outcome.newest_first
    items = list(question.candidates)
    order = items[::-1] if newest_first else items
    name = context.axis.name

    def first_of(culprit: T) -> str:
        """The first item (version order) of the end side, when `culprit` starts the bad one."""
        return name(order[order.index(culprit) - 1] if newest_first else culprit)

    status = {"found": "found", "no_change": "no-change"}.get(answer.status, "undecided")
    status = "undecided" if counted else status  # disk verdicts confirm, never decide
    fields: dict[str, Any] = {
        "status": status,
        "strategy": "flaky",
        "start_verdict": (Verdict.REPRODUCED if newest_first else Verdict.CLEAN).value,
        "end_verdict": (Verdict.CLEAN if newest_first else Verdict.REPRODUCED).value,
        "confidence": kept_posterior(answer.confidence),
        "target_confidence": context.strategy.confidence,
        "no_change": kept_posterior(answer.no_change),
        "posterior": {first_of(item): kept_posterior(p) for item, p in answer.posterior},
        "outcomes": {name(item): [k, n] for item, k, n in answer.counts},
        "agreeing": held.used if held is not None and held.holds else 0,
    }
    if status == "found" and answer.culprit is not None:
        at = order.index(answer.culprit)
        pair = (order[at - 1], answer.culprit)
        last, first = pair if not newest_first else pair[::-1]
        fields.update(first=name(first), last_start=name(last))
    leaders = answer.top or _leaders(answer)
    if status == "undecided":
        fields["candidates"] = [first_of(item) for item, _ in leaders if item is not None]
    summary = question.asked.model_copy(update=fields)
    summary = summary.model_copy(update={"assumption": _assumption(context, outcome, answer)})
    line = _line(context, outcome, summary, answer, order, [
        (first_of(item) if item is not None else None, p) for item, p in leaders
    ])  # fmt: skip
    return summary.model_copy(update={"result": line})


def _assumption(context: Context[T], outcome: Outcome[T], answer: FlakyAnswer[T]) -> str:
    """What the posterior rests on: at most one change (a culprit, or none), how much of the
    range it probed, the verdicts on disk, and what the axis adds."""
    question = context.question
    probed = len({item for item, _, _ in answer.counts})
    extra = (
        f"assuming at most one change between {question.ends[0]} and {question.ends[1]}; "
        f"{probed} of {len(question.candidates)} {question.noun}s probed"
    )
    skipped = [item for item, seen in answer.observations if seen is None]
    if skipped:
        listed = ", ".join(context.axis.name(item) for item in skipped)
        extra += f"; cannot test {listed} (skipped)"
    held = outcome.checked
    if held is not None:
        extra += (
            f"; {held.used} verdict(s) on disk agree"
            if held.holds
            else f"; {held.used} verdict(s) on disk move the posterior"
            if held.moved
            else f"; {held.used} verdict(s) on disk counted in"
        )
    if outcome.unread:
        extra += f"; {outcome.unread}"
    return extra + question.note + outcome.notes


def _line(
    context: Context[T],
    outcome: Outcome[T],
    summary: BisectSummary,
    answer: FlakyAnswer[T],
    order: list[T],
    leaders: list[tuple[str | None, float]],
) -> str:
    """`first reproducing release: trl X (posterior 0.995 after 23 runs; reproduces in 7 of
    10 runs (70%) at and after X, 0 of 9 before; ...)`, or no change, or the candidates
    left with their probabilities."""
    question, strategy = context.question, context.strategy
    subject = question.subject
    runs = f"after {answer.runs} runs"
    sure = shown_posterior(answer.confidence)
    kind = verdict_word(summary.end_verdict)
    counts = {item: (k, n) for item, k, n in answer.counts}

    def tally(part: list[T]) -> tuple[int, int]:
        return (
            sum(counts.get(i, (0, 0))[0] for i in part),
            sum(counts.get(i, (0, 0))[1] for i in part),
        )

    if summary.status == "found" and answer.culprit is not None:
        at = order.index(answer.culprit)
        (k_bad, n_bad), (k_good, n_good) = tally(order[at:]), tally(order[:at])
        first = summary.first or ""
        rate = f"{k_bad} of {n_bad} runs ({k_bad / max(n_bad, 1):.0%})"
        if summary.end_verdict == Verdict.REPRODUCED.value:
            seen = f"reproduces in {rate} at and after {first}, {k_good} of {n_good} before"
        else:
            seen = f"reproduces in {rate} before {first}, {k_good} of {n_good} at and after"
        return (
            f"first {kind} {question.word}: {subject}{first} (posterior {sure} "
            f"{runs}; {seen}; {summary.assumption})"
        )
    k_all, n_all = tally(order)
    if summary.status == "no-change":
        throughout = "reproducing" if answer.throughout == "reproduced" else "clean"
        return (
            f"no change in the range: {throughout} throughout {subject}{question.ends[0]} to "
            f"{question.ends[1]} (posterior {sure} {runs}; reproduces in {k_all} "
            f"of {n_all} runs; {summary.assumption})"
        )
    listed = ", ".join(
        f"{item} ({p:.2f})" if item is not None else f"no change ({p:.2f})"
        for item, p in leaders[:SHOWN]
    )
    held = outcome.checked
    why = (
        "verdicts on disk move the posterior off the search's answer; "
        if held is not None and held.moved
        else ""
    )
    more = (
        "run more with a higher --max-runs, or map"
        if answer.runs >= strategy.max_runs
        else "no probe left can tell them apart; map"
    )
    return (
        f"undecided {runs} (target {strategy.confidence}): {why}the first {kind} "
        f"{question.word} could be {subject}{listed}; {more} every {question.noun} with a sweep "
        f"({summary.assumption})"
    )


def _leaders(answer: FlakyAnswer[T]) -> list[tuple[T | None, float]]:
    ranked: list[tuple[T | None, float]] = [*answer.posterior, (None, answer.no_change)]
    return sorted(ranked, key=lambda pair: -pair[1])
