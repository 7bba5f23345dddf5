"""The one bisect driver: every axis (releases, days, commits; a sweep's map) runs the same way.

It holds the probe log, builds the prober from the axis's probes, checks the ends (with the
verdicts already on disk, so ends alike name what differs inside the range), runs the
strategy's search (binary, multisection for K workers, the flake-aware posterior of
`bisect.posterior` or the metric search of `bisect.shift`), verifies the answer with extra
probes over each side, holds it against every verdict on disk (`checks.verdicts_on_disk`),
hands the immutable `Outcome` to the axis's `refine`, and writes the summary with the axis's
answer line. An axis adds only what it alone knows (`axes.Axis`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from reprobox.bisect import checks, posterior, shift
from reprobox.bisect.answer_line import assumption
from reprobox.bisect.axes import Axis, Context
from reprobox.bisect.outcome import Outcome
from reprobox.bisect.plan import StepsLeft
from reprobox.bisect.probe_log import ProbeLog
from reprobox.bisect.prober import BisectError, Prober, Target, answering, default_log
from reprobox.bisect.search import SearchError, ThreadRunner, bisect, multisect
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import (
    BisectSummary,
    Contradiction,
    ProbeEntry,
    from_search,
    runs_dir,
    write_summary,
)

T = TypeVar("T")


def drive(
    target: Target,
    axis: Axis[T],
    strategy: Strategy,
    *,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
) -> BisectSummary:
    """Search `axis` for where the verdict flips, as `strategy` says; the summary, written
    beside the log (`--log`, or one derived from the axis's header: same question, same
    log, so running it again resumes)."""
    strategy, question = strategy.check(), axis.question
    if not strategy.mapping and len(question.candidates) < 2:
        raise BisectError(f"a bisect needs at least two {question.noun}s")
    header = dict(question.header)
    path = log_path or default_log(target, header)
    with ProbeLog(path, header) as log:
        prober = Prober(
            axis.probes(runs_dir(path)), log, axis.name,
            tags=lambda item: question.tags(axis.name(item)),
            on_probe=_counting(question.names, strategy, on_probe),
        )  # fmt: skip
        context = Context(axis, target, prober, log, strategy)
        started = time.monotonic()
        try:
            if strategy.mapping:
                outcome = axis.refine(_map(context), prober, strategy)
            elif strategy.flaky and strategy.metric is not None:
                outcome = shift.search(context)
            elif strategy.flaky:
                outcome = posterior.search(context)
            else:
                outcome = axis.refine(_search(context), prober, strategy)
        finally:
            prober.close()
        if strategy.mapping:
            summary = _mapped(context, outcome)
        elif strategy.flaky and strategy.metric is not None:
            summary = shift.summarize(context, outcome)
        elif strategy.flaky:
            summary = posterior.summarize(context, outcome)
        else:
            summary = _summarize(context, outcome)
        took = time.monotonic() - started
        summary = summary.counts(prober.runs, len(question.candidates), took)
        return write_summary(path, summary)


def _counting(
    names: tuple[str, ...], strategy: Strategy, on_probe: Callable[[ProbeEntry], None] | None
) -> Callable[[ProbeEntry], None] | None:
    """`on_probe`, each entry with the steps its search has left (`plan.StepsLeft`)."""
    if on_probe is None:
        return None
    left = StepsLeft(names, strategy)
    heard = on_probe

    def counted(entry: ProbeEntry) -> None:
        heard(entry.model_copy(update={"steps_left": left.after(entry)}))

    return counted


def _map(context: Context[T]) -> Outcome[T]:
    """Every item probed once, `workers` at a time (one at a time: the next one's environment
    prepared while the current one runs), and the verdicts on disk about them."""
    items, prober = list(context.question.candidates), context.prober
    workers = context.strategy.workers
    if workers > 1:
        found = prober.probe_all([(item, 1) for item in items], workers)
    else:
        found = []
        for number, item in enumerate(items):
            prober.prefetch(items[number + 1 : number + 2])
            found.append(prober(item, 1))
    known, unread = context.on_disk()
    return Outcome(verdicts=tuple(zip(items, found, strict=True)), on_disk=tuple(known),
                   unread=unread)  # fmt: skip


def _search(context: Context[T]) -> Outcome[T]:
    """The ends, the search, the verify probes and the verdicts on disk."""
    axis, prober, strategy, question = (
        context.axis,
        context.prober,
        context.strategy,
        context.question,
    )
    items, workers = list(question.candidates), strategy.workers
    before, _ = checks.verdicts_on_disk(context.target, question.asked, context.log, set())
    good = question.good if question.good is not None else items[0]
    bad = question.bad if question.bad is not None else items[-1]
    checks.check_ends(
        prober, good, bad, shown=lambda item: question.shown(axis.name(item)),
        noun=question.noun, sweep=question.sweep, workers=workers, items=list(question.names),
        on_disk=before, key=question.key, flags=question.flags, either_way=question.good is None,
        advice=question.ends_advice,
    )  # fmt: skip
    with answering(_came_and_went(question.came_and_went)):
        if workers > 1:
            runner = ThreadRunner(prober, workers, on_interrupt=prober.stop)
            result = multisect(
                items, prober, workers=workers, confirm=strategy.confirm, runner=runner
            )
        else:
            result = bisect(items, prober, confirm=strategy.confirm, prefetch=prober.prefetch)
    found = [
        Contradiction(item=axis.name(item), verdict=verdict, expected=expected, source="probe")
        for item, verdict, expected in result.contradictions
    ]
    verified: list[str] = []
    if result.status != "flaky":
        k = checks.default_verify(len(items)) if strategy.verify is None else strategy.verify
        contradicting, verified = checks.verify_sides(prober, items, result, k, workers)
        found += contradicting
    on_disk, unread = context.on_disk()
    base = from_search(question.asked, result, [], verified, shown=axis.name)
    against, agreeing = base.contradicted_by(on_disk)
    return Outcome(
        result=result, found=tuple(checks.unique([*found, *against])), verified=tuple(verified),
        agreeing=agreeing, unread=unread,
    )  # fmt: skip


def _came_and_went(advice: str) -> Callable[[SearchError], str] | None:
    """What a search whose ends agree adds to its error (the axis's words), or None."""
    if not advice:
        return None

    def said(exc: SearchError) -> str:
        return advice if exc.same_ends else ""

    return said


def _summarize(context: Context[T], outcome: Outcome[T]) -> BisectSummary:
    """The summary of a plain search: the answer (non-monotone on any contradiction), what
    it assumed, and the closing line (the axis's, made once)."""
    axis, question = context.axis, context.question
    assert outcome.result is not None
    summary = from_search(
        question.asked, outcome.result, list(outcome.found), list(outcome.verified),
        shown=axis.name, final=outcome.final, agreeing=outcome.agreeing,
        details=outcome.details,
    )  # fmt: skip
    probes = list(context.prober.runs)  # a flaky line counts each item's verdicts
    said = assumption(question.noun, question.ends, probed(context), len(question.candidates),
                      notes(context, outcome))  # fmt: skip
    summary = summary.model_copy(update={"probes": probes, "assumption": said})
    return summary.model_copy(update={"result": axis.answer(summary, outcome)})


def _mapped(context: Context[T], outcome: Outcome[T]) -> BisectSummary:
    """The summary of a map: every item's verdict (the axis's `details`), the verdicts on
    disk against them, and the closing line (the axis's)."""
    summary = context.question.asked.model_copy(
        update={
            "status": "mapped", "contradictions": list(outcome.found),
            "agreeing": outcome.agreeing,
            "details": outcome.details or context.question.asked.details,
        }
    )  # fmt: skip
    return summary.model_copy(update={"result": context.axis.answer(summary, outcome)})


def probed(context: Context[T]) -> int:
    """How many of the axis's candidates this session probed."""
    return len({p.item for p in context.prober.runs} & set(context.question.names))


def notes(context: Context[T], outcome: Outcome[T]) -> str:
    """What the assumption adds: the verify probes, agreeing verdicts on disk, what could not
    be read, then what the axis adds (the overrides, a commit's descent)."""
    return (
        (f", {len(outcome.verified)} of them to verify" if outcome.verified else "")
        + (f"; {outcome.agreeing} verdict(s) on disk agree" if outcome.agreeing else "")
        + (f"; {outcome.unread}" if outcome.unread else "")
        + context.question.note
        + outcome.notes
    )
