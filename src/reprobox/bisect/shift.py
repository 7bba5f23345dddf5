"""The metric strategy under the driver: `bisect.changepoint`'s search, on real probes.

For a variant whose declared test reads a metric (t, sign), a flaky bisect's probe is one
launch and its observation is the launch's value of that metric, not the per-launch rule's
verdict: the same samples the declared test reads. A batch of launches of one candidate is K
probes (attempts 1..K), each its own run and its own line in the probe log, so a bisect run
again after `kill -9` replays them (their values are logged) and goes on where it stopped.

Verdicts on disk are not held against the answer here: they are judgements by the per-launch
rule or by a test at one release, not samples of the metric; the line says so.
"""

from __future__ import annotations

from typing import Any, TypeVar

from reprobox.bisect.answer_line import kept_posterior, shown_posterior
from reprobox.bisect.axes import Context
from reprobox.bisect.changepoint import ShiftAnswer, shift_search
from reprobox.bisect.outcome import Outcome
from reprobox.bisect.segments import Level
from reprobox.bisect.summary import BisectSummary

T = TypeVar("T")
SHOWN = 5  # candidates an undecided answer names


def search(context: Context[T]) -> Outcome[T]:
    """Probe in batches until the target confidence or the run budget."""
    prober, strategy = context.prober, context.strategy
    items = list(context.question.candidates)
    workers = strategy.workers

    def probe(jobs: list[tuple[T, int]]) -> list[float | None]:
        return prober.values(jobs, workers)

    found = shift_search(
        items, probe, confidence=strategy.confidence, max_runs=strategy.max_runs,
        workers=workers, min_effect=strategy.min_shift,
    )  # fmt: skip
    _, unread = context.on_disk()
    return Outcome(shift=found, unread=unread)


def _level(level: Level) -> list[float | None]:
    return [level.n, round(level.mean, 6), round(level.sd, 6) if level.sd is not None else None]


def summarize(context: Context[T], outcome: Outcome[T]) -> BisectSummary:
    """The summary: found (the first item of the shifted segment), no change (within the
    smallest shift that counts) or undecided, with every probed item's samples."""
    question, answer = context.question, outcome.shift
    assert answer is not None
    name = context.axis.name
    status = {"found": "found", "no_change": "no-change"}.get(answer.status, "undecided")
    fields: dict[str, Any] = {
        "status": status,
        "strategy": "shift",
        "metric": context.strategy.metric,
        "confidence": kept_posterior(answer.confidence),
        "target_confidence": context.strategy.confidence,
        "no_change": kept_posterior(answer.no_change),
        "posterior": {name(item): kept_posterior(p) for item, p in answer.posterior},
        "levels": {name(item): _level(level) for item, level in answer.levels},
        "min_shift": answer.min_effect,
        "shift": round(answer.effect, 4) if answer.effect is not None else None,
    }
    items = list(question.candidates)
    if status == "found" and answer.culprit is not None:
        at = items.index(answer.culprit)
        rising = (answer.effect or 0) > 0
        fields.update(
            first=name(answer.culprit),
            last_start=name(items[at - 1]),
            start_verdict="clean" if rising else "reproduced",
            end_verdict="reproduced" if rising else "clean",
        )
    if status == "undecided":
        fields["candidates"] = [name(item) for item, _ in answer.top if item is not None]
    summary = question.asked.model_copy(update=fields)
    summary = summary.model_copy(update={"assumption": _assumption(context, outcome, answer)})
    return summary.model_copy(update={"result": _line(context, summary, answer)})


def _assumption(context: Context[T], outcome: Outcome[T], answer: ShiftAnswer[T]) -> str:
    """What the posterior rests on: one shift of the mean at most, of at least min_shift sd,
    launches independent of each other (their values read by rank: no shape assumed), how
    much of the range it probed."""
    question = context.question
    probed = len(answer.levels)
    extra = (
        f"assuming at most one shift of the mean between {question.ends[0]} and "
        f"{question.ends[1]}, a shift under {answer.min_effect:g} sd counting as none, and "
        "launches independent of each other (their values read by rank); "
        f"{probed} of {len(question.candidates)} {question.noun}s probed"
    )
    skipped = [item for item, value in answer.observations if value is None]
    if skipped:
        listed = ", ".join(dict.fromkeys(context.axis.name(item) for item in skipped))
        extra += f"; cannot test {listed} (skipped)"
    if outcome.unread:
        extra += f"; {outcome.unread}"
    return extra + question.note + outcome.notes


def _mean(level: Level) -> str:
    return f"{level.mean:.4g} (n={level.n})"


def _line(context: Context[T], summary: BisectSummary, answer: ShiftAnswer[T]) -> str:
    """`first release where loss's mean shifts: tomli 2.0.0 (posterior 0.995 after 212
    runs; mean 0.51 (n=96) at and after 2.0.0, 0.02 (n=80) before: +0.49 sd; ...)`, or no
    change, or the candidates left with their probabilities."""
    question, metric = context.question, summary.metric
    subject = question.subject
    runs = f"after {answer.runs} runs"
    sure = shown_posterior(answer.confidence)
    if summary.status == "found" and answer.before is not None and answer.after is not None:
        first = summary.first or ""
        shift = f"{answer.effect:+.2f} sd" if answer.effect is not None else "shifted"
        return (
            f"first {question.word} where {metric}'s mean shifts: {subject}{first} (posterior "
            f"{sure} {runs}; mean {_mean(answer.after)} at and after {first}, "
            f"{_mean(answer.before)} before: {shift}; {summary.assumption})"
        )
    if summary.status == "no-change":
        return (
            f"no change in the range: {metric}'s mean is the same throughout {subject}"
            f"{question.ends[0]} to {question.ends[1]} within {answer.min_effect:g} sd (posterior "
            f"{sure} {runs}; {summary.assumption})"
        )
    listed = ", ".join(
        f"{subject}{context.axis.name(item)} ({p:.2f})"
        if item is not None
        else f"no change ({p:.2f})"
        for item, p in answer.top[:SHOWN]
    )
    more = (
        "run more with a higher --max-runs, or map"
        if answer.runs >= context.strategy.max_runs
        else "no probe left can tell them apart; map"
    )
    return (
        f"undecided {runs} (target {context.strategy.confidence}): where {metric}'s mean "
        f"shifts could be {listed}; {more} every {question.noun} with a sweep "
        f"({summary.assumption})"
    )
