"""One judgement from repeated launches of a noisy cell ([verdict] repeats).

Each launch is judged by `judge.judge` as any launch is; this module turns those per-launch
judgements into one: reproduced, clean or undecided, with the stated test (core.stats), its
statistic, p-value, interval, n, alpha and effect. A launch that errored ends the cell as an
error (a crash is never a sample); one that cannot test ends it as cannot-test.

When the tests are read:
- "sprt" (each launch's verdict, pass/fail): after every round of launches; Wald's
  boundaries hold however often they are read, so it stops as soon as it decides.
- "t" / "sign" (a metric's samples): at planned looks only (the repeats, or for "auto" 5,
  10, 20, ... up to the budget), each at alpha / the number of looks (Bonferroni), so looking
  early never inflates the stated false-alarm rate.
Undecided with the budget spent is the answer, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from reprobox.core import stats
from reprobox.core.errors import ExitCode
from reprobox.core.judge import Judgement, Status, status_for
from reprobox.core.protocol import Expectation, Verdict
from reprobox.core.spec import VerdictSection

SPRT_EFFECT = 0.5  # the reproduction rate above `floor` that matters, unless stated
FIRST_LOOK = 5  # "auto" metric tests: the first look, then doubling up to the budget


def most(section: VerdictSection) -> int:
    """The most launches the cell may take."""
    return section.budget if section.repeats == "auto" else int(section.repeats or 1)


def looks(section: VerdictSection) -> list[int]:
    """The numbers of launches at which the test is read (sprt: after any of them)."""
    top = most(section)
    if section.test == "sprt":
        return list(range(1, top + 1))
    if section.repeats != "auto":
        return [top]
    planned, n = [], min(FIRST_LOOK, top)
    while n < top:
        planned.append(n)
        n *= 2
    return [*planned, top]


def next_look(section: VerdictSection, done: int) -> int:
    """How many launches there should be at the next reading (at most `most`)."""
    return next((n for n in looks(section) if n > done), most(section))


def _look_alpha(section: VerdictSection) -> float:
    return section.alpha if section.test == "sprt" else section.alpha / len(looks(section))


def aggregate(
    section: VerdictSection,
    expect: Expectation,
    also_ok: Iterable[Verdict],
    judged: Sequence[Judgement],
    samples: list[dict[str, Any]],
) -> Judgement:
    """The cell's judgement from its launches so far (`samples`: one entry per launch, in
    order). Undecided means run more while launches are left (`most`), else it is final."""
    for one in judged:
        if one.status is Status.ERROR or one.verdict is Verdict.CANNOT_TEST:
            why = f"launch {len(samples)} of the repeats: {one.reason}"
            return _with(one, samples, None, why if one.status is Status.ERROR else one.reason)
    stat = _test(section, judged)
    last = judged[-1]
    decision = stat["decision"]
    shown = summary(stat)
    if decision == stats.Decision.UNDECIDED.value:
        left = most(section) - len(judged)
        more = f"runs {left} more" if left else "the budget is spent; add launches or data"
        return Judgement(
            verdict=None,
            status=Status.UNDECIDED,
            reason=f"undecided after {len(judged)} launches: {shown}; {more}",
            exit_code=ExitCode.UNDECIDED,
            metrics=_means(judged),
            decided_by=_decided_by(section, last),
            result=last.result,
            samples=samples,
            stat=stat,
        )
    verdict = Verdict(decision)
    status = status_for(verdict, expect, also_ok)
    return Judgement(
        verdict=verdict,
        status=status,
        reason=f"{verdict.value} from {len(judged)} launches: {shown}",
        exit_code=ExitCode.FAILED if status is Status.MISMATCH else ExitCode.OK,
        metrics=_means(judged),
        decided_by=_decided_by(section, last),
        result=last.result,
        samples=samples,
        stat=stat,
    )


def decided(judgement: Judgement) -> bool:
    """Whether more launches could change it: not once it errored, cannot test or decided."""
    return judgement.status is not Status.UNDECIDED


def _with(
    one: Judgement, samples: list[dict[str, Any]], stat: dict[str, Any] | None, reason: str
) -> Judgement:
    return Judgement(
        verdict=one.verdict,
        status=one.status,
        reason=reason,
        exit_code=one.exit_code,
        metrics=one.metrics,
        decided_by=one.decided_by,
        result=one.result,
        samples=samples,
        stat=stat,
    )


def _decided_by(section: VerdictSection, last: Judgement) -> list[str]:
    return [section.metric] if section.metric is not None else last.decided_by


def _means(judged: Sequence[Judgement]) -> dict[str, float]:
    """Each metric's mean over the launches that report it (the record's `metrics`)."""
    names = dict.fromkeys(name for one in judged for name in one.metrics)
    means = {}
    for name in names:
        values = [one.metrics[name] for one in judged if name in one.metrics]
        means[name] = math.fsum(values) / len(values)
    return means


def threshold(section: VerdictSection) -> float:
    """The value a metric test holds the metric's samples against: stated, else the rule's."""
    if section.threshold is not None:
        return section.threshold
    return next(r.above for r in section.reproduced_if if r.metric == section.metric)


def _test(section: VerdictSection, judged: Sequence[Judgement]) -> dict[str, Any]:
    """The stated test over the launches: what `Record.stat` keeps."""
    alpha = _look_alpha(section)
    n = len(judged)
    if section.test == "sprt":
        effect = SPRT_EFFECT if section.effect is None else section.effect
        k = sum(1 for one in judged if one.verdict is Verdict.REPRODUCED)
        rate = stats.pass_fail(
            k, n, floor=section.floor, effect=effect, alpha=alpha, beta=section.beta
        )
        return {
            "test": rate.test,
            "decision": rate.decision.value,
            "statistic": _finite(rate.llr),
            "p": rate.p_value,
            "ci": list(rate.ci),
            "confidence": 1 - alpha,
            "estimate": rate.rate,
            "reproduced": k,
            "n": n,
            "alpha": section.alpha,
            "beta": section.beta,
            "effect": effect,
            "floor": section.floor,
        }
    assert section.metric is not None  # spec_rules: a metric test names its metric
    mu, effect = threshold(section), section.effect or 0.0
    values = [one.metrics[section.metric] for one in judged if section.metric in one.metrics]
    missing = n - len(values)
    read: stats.MetricTest | None
    if section.test == "t" and len(values) >= 2:
        read = stats.t_test(values, mu=mu, alpha=alpha)
    elif section.test == "sign" and values:
        read = stats.sign_test(values, mu=mu, alpha=alpha)
    else:
        read = None
    ci = read.ci if read is not None else None
    if ci is not None and ci[0] > mu:
        decision = stats.Decision.REPRODUCED
    elif ci is not None and ci[1] < mu + effect:
        decision = stats.Decision.CLEAN
    else:
        decision = stats.Decision.UNDECIDED
    estimate = read.estimate if read is not None else (values[0] if values else None)
    return {
        "test": read.test if read is not None else f"{section.test}: too few samples",
        "decision": decision.value,
        "statistic": _finite(read.statistic) if read is not None else None,
        "p": read.p_value if read is not None else 1.0,
        "ci": list(ci) if ci is not None else None,
        "confidence": 1 - alpha,
        "estimate": estimate,
        "metric": section.metric,
        "threshold": mu,
        "n": len(values),
        "missing": missing,
        "alpha": section.alpha,
        "effect": effect,
        "looks": looks(section),
        "values": values,
    }


def _finite(value: float) -> float | None:
    """JSON has no infinity: an unbounded statistic (every launch alike) is kept as null."""
    return value if math.isfinite(value) else None


def summary(stat: dict[str, Any]) -> str:
    """`mean ± half-interval (99% CI, n=6)` for a metric, `5/6 reproduced, rate 0.83 (99% CI
    0.35-1.00, n=6)` for pass/fail: what the table, report and comment show."""
    level = (
        f"{stat['confidence']:.0%}" if stat["confidence"] < 0.995 else f"{stat['confidence']:.1%}"
    )
    ci = stat.get("ci")
    if "reproduced" in stat and ci is not None:
        return (
            f"{stat['reproduced']}/{stat['n']} reproduced, rate {stat['estimate']:.2f} "
            f"({level} CI {ci[0]:.2f}-{ci[1]:.2f}, n={stat['n']}; {stat['test']}; "
            f"p={stat['p']:.2g})"
        )
    name = stat["metric"]
    if ci is None:
        return f"{name}: {stat['test']} (n={stat['n']})"
    if stat["test"].startswith("one-sample t-test"):
        centre = f"{stat['estimate']:.4g} ± {(ci[1] - ci[0]) / 2:.2g}"
    else:
        centre = f"median {stat['estimate']:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]"
    return (
        f"{name} = {centre} ({level} CI, n={stat['n']}; vs {stat['threshold']:g}, "
        f"{stat['test']}, p={stat['p']:.2g})"
    )
