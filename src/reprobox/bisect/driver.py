"""The one bisect driver: every axis (releases, days, commits; a sweep's map) runs the same way.

It holds the probe log, builds the prober from the axis's probes, checks the ends (with the
verdicts already on disk, so ends alike name what differs inside the range), runs the
strategy's search (binary, multisection for K workers, or the flake-aware posterior of
`bisect.posterior`), verifies the answer with extra probes over each side, holds it against
every verdict on disk (`checks.verdicts_on_disk`), and writes the summary. An axis adds only
what it alone knows through its hooks (`axes.Axis`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from reprobox.bisect import checks, posterior, shift
from reprobox.bisect.axes import Axis, Run, Strategy
from reprobox.bisect.log import ProbeLog
from reprobox.bisect.plan import StepsLeft
from reprobox.bisect.prober import BisectError, Prober, Target, answering, default_log
from reprobox.bisect.search import ThreadRunner, bisect, multisect
from reprobox.bisect.summary import (
    BisectSummary,
    Contradiction,
    ProbeEntry,
    answer,
    assumption,
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
    strategy = strategy.check()
    if not strategy.mapping and len(axis.items) < 2:
        raise BisectError(f"a bisect needs at least two {axis.noun}s")
    path = log_path or default_log(target, axis.header)
    question = BisectSummary.model_validate(axis.fields)
    with ProbeLog(path, axis.header) as log:
        probes = axis.probes_for(runs_dir(path))
        prober = Prober(probes, log, axis.describe, tags=axis.tags,
                        on_probe=_counting(axis, strategy, on_probe))  # fmt: skip
        run = Run(axis, target, prober, log, strategy, question)
        started = time.monotonic()
        try:
            if strategy.mapping:
                _map(run)
            elif strategy.flaky and strategy.metric is not None:
                shift.search(run)
            elif strategy.flaky:
                posterior.search(run)
            else:
                _search(run)
                if axis.refine is not None:
                    axis.refine(run)
        finally:
            prober.close()
        if strategy.mapping:
            assert axis.summarize is not None, "a map needs the axis's summary"
            summary = axis.summarize(run)
        elif strategy.flaky and strategy.metric is not None:
            summary = shift.summarize(run)
        elif strategy.flaky:
            summary = posterior.summarize(run)
        else:
            summary = _summarize(run)
        summary = summary.counts(prober.runs, len(axis.items), time.monotonic() - started)
        return write_summary(path, summary)


def _counting(
    axis: Axis[T], strategy: Strategy, on_probe: Callable[[ProbeEntry], None] | None
) -> Callable[[ProbeEntry], None] | None:
    """`on_probe`, each entry with the steps its search has left (`plan.StepsLeft`)."""
    if on_probe is None:
        return None
    left = StepsLeft(axis.names, strategy)
    heard = on_probe

    def counted(entry: ProbeEntry) -> None:
        heard(entry.model_copy(update={"steps_left": left.after(entry)}))

    return counted


def _map(run: Run[T]) -> None:
    """Every item probed once, `workers` at a time (one at a time: the next one's environment
    prepared while the current one runs)."""
    items, prober, workers = list(run.axis.items), run.prober, run.strategy.workers
    if workers > 1:
        found = prober.probe_all([(item, 1) for item in items], workers)
        run.verdicts = list(zip(items, found, strict=True))
        return
    for number, item in enumerate(items):
        prober.prefetch(items[number + 1 : number + 2])
        run.verdicts.append((item, prober(item, 1)))


def _search(run: Run[T]) -> None:
    """The ends, the search, the verify probes and the verdicts on disk."""
    axis, prober, strategy = run.axis, run.prober, run.strategy
    items, workers = list(axis.items), strategy.workers
    before, _ = checks.verdicts_on_disk(run.target, run.question, run.log, set())
    good = axis.good if axis.good is not None else items[0]
    bad = axis.bad if axis.bad is not None else items[-1]
    checks.check_ends(
        prober, good, bad, shown=axis.name_of, noun=axis.noun, sweep=axis.sweep,
        workers=workers, items=axis.names, on_disk=before, key=axis.key, flags=axis.flags,
        either_way=axis.good is None, advice=axis.ends_advice,
    )  # fmt: skip
    with answering(axis.advice):
        if workers > 1:
            runner = ThreadRunner(prober, workers, on_interrupt=prober.stop)
            result = multisect(
                items, prober, workers=workers, confirm=strategy.confirm, runner=runner
            )
        else:
            result = bisect(items, prober, confirm=strategy.confirm, prefetch=prober.prefetch)
    run.result = result
    found = [
        Contradiction(item=axis.describe(item), verdict=verdict, expected=expected, source="probe")
        for item, verdict, expected in result.contradictions
    ]
    if result.status != "flaky":
        k = checks.default_verify(len(items)) if strategy.verify is None else strategy.verify
        contradicting, run.verified = checks.verify_sides(prober, items, result, k, workers)
        found += contradicting
    on_disk, run.unread = run.on_disk()
    base = from_search(axis.fields, result, [], run.verified, shown=axis.describe)
    against, run.agreeing = base.contradicted_by(on_disk)
    run.found = checks.unique([*found, *against])


def _summarize(run: Run[T]) -> BisectSummary:
    """The summary of a plain search: the answer (non-monotone on any contradiction), what
    it assumed, and the closing line."""
    axis = run.axis
    assert run.result is not None
    summary = from_search(
        axis.fields, run.result, run.found, run.verified, shown=axis.describe,
        final=run.final, agreeing=run.agreeing, yanked=axis.yanked, **run.more,
    )  # fmt: skip
    summary.probes = list(run.prober.runs)  # a flaky line counts each item's verdicts
    summary.assumption = assumption(axis.noun, axis.ends, probed(run), len(axis.items), notes(run))
    if axis.answer is not None:
        summary.result = axis.answer(summary, run)
    else:
        summary.result = answer(summary, axis.word, axis.subject, axis.ends, suggest=axis.suggest)
    return summary


def probed(run: Run[T]) -> int:
    """How many of the axis's candidates this session probed."""
    return len({p.item for p in run.prober.runs} & set(run.axis.names))


def notes(run: Run[T]) -> str:
    """What the assumption adds: the verify probes, agreeing verdicts on disk, what could not
    be read, then what the axis adds (the overrides, a commit's descent)."""
    return (
        (f", {len(run.verified)} of them to verify" if run.verified else "")
        + (f"; {run.agreeing} verdict(s) on disk agree" if run.agreeing else "")
        + (f"; {run.unread}" if run.unread else "")
        + (run.axis.notes(run) if run.axis.notes is not None else "")
    )
