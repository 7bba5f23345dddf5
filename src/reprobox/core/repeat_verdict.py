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

How many launches a t-test needs is a stated power calculation (`stats.t_launches`): for a
mean `effect` away from `threshold` to have its interval clear of it with chance 1 - beta,
at the per-look alpha and the spread the samples show. It is recomputed at every look that
leaves the cell undecided, from the running sd: the reason names it, and with "auto" the
cell stops (undecided) as soon as even the sd's 95% lower bound needs more launches than
the budget, rather than spending it. Where the looks fall never depends on the samples, so
the stated alpha holds exactly. The default budget of a metric test (200, `VerdictSection.
most`) is what a shift of half a standard deviation needs at alpha = beta = 0.01 (about 128
launches at 0.01 / 7 looks, read at the look of 160).
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
    """The most launches the cell may take (`VerdictSection.most`)."""
    return section.most


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
        if stat.get("futile"):
            more = (
                f"stopped: even at the sd's 95% lower bound ({stat['sd_low']:.3g}) it needs "
                f"more than the {most(section)} launches allowed; raise budget, or state the "
                "effect that matters"
            )
        if stat.get("needed") is not None:
            more = f"{planned(stat)}; {more}"
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
    """Whether more launches could change it: not once it errored, cannot test or decided,
    nor once the launches left cannot decide it (`futile`: the power calculation)."""
    stat = judgement.stat or {}
    return judgement.status is not Status.UNDECIDED or bool(stat.get("futile"))


def planned(stat: dict[str, Any]) -> str:
    """`at the spread seen (sd 1.02), telling gap = 0 from 0.5 at alpha 0.0014 a look and
    beta 0.01 needs about 128 launches`: the power calculation, said."""
    return (
        f"at the spread seen (sd {stat['sd']:.3g}), telling {stat['metric']} = "
        f"{stat['threshold']:g} from {stat['threshold'] + stat['effect']:g} at alpha "
        f"{1 - stat['confidence']:.2g} a look and beta {stat['beta']:g} needs about "
        f"{stat['needed']} launches"
    )


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
    """The value a metric test holds the metric's samples against: always stated
    (spec_rules), never read from a per-launch rule."""
    assert section.threshold is not None, "spec_rules: a metric test states its threshold"
    return section.threshold


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
    power = (
        _power(section, values, alpha, effect, len(values) >= most(section))
        if section.test == "t" and decision is stats.Decision.UNDECIDED and len(values) >= 2
        else {}
    )
    return {
        **power,
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


def _power(
    section: VerdictSection, values: Sequence[float], alpha: float, effect: float, spent: bool
) -> dict[str, Any]:
    """The power calculation at this look (module docstring): the launches needed at the
    running sd (`needed`), and with "auto" whether even its 95% lower bound needs more than
    the budget (`futile`). Nothing without an effect to plan for."""
    if effect <= 0:
        return {}
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    needed = stats.t_launches(sd, effect, alpha=alpha, beta=section.beta)
    low = stats.sd_lower(sd, n - 1)
    futile = (
        section.repeats == "auto"
        and not spent
        and stats.t_launches(low, effect, alpha=alpha, beta=section.beta) > most(section)
    )
    return {"sd": sd, "sd_low": low, "needed": needed, "beta": section.beta, "futile": futile}


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


def declared(section: VerdictSection) -> dict[str, Any] | None:
    """The declared test as data (`reprobox list --json`): None for one launch, judged by the
    rule alone."""
    if section.repeats is None:
        return None
    found: dict[str, Any] = {
        "test": section.test,
        "repeats": section.repeats,
        "most": most(section),
        "alpha": section.alpha,
        "beta": section.beta,
        "seed": section.seed,
    }
    if section.test == "sprt":
        effect = SPRT_EFFECT if section.effect is None else section.effect
        return {**found, "floor": section.floor, "effect": effect}
    return {
        **found,
        "metric": section.metric,
        "threshold": section.threshold,
        "effect": section.effect or 0.0,
    }


def describe(section: VerdictSection) -> str:
    """The declared test in one sentence, as `reprobox list` and the report's "Expected
    behavior" say it; "" for one launch judged by the rule."""
    test = declared(section)
    if test is None:
        return ""
    if test["test"] == "sprt":
        return (
            f"judged from repeated launches by Wald's SPRT over each launch's verdict: "
            f"reproduced when it reproduces at a rate >= {test['floor'] + test['effect']:g}, "
            f"clean at <= {test['floor']:g} (alpha {test['alpha']:g}, beta {test['beta']:g}; "
            f"at most {test['most']} launches)"
        )
    launches = (
        f'up to {test["most"]} launches ("auto": planned from the spread)'
        if test["repeats"] == "auto"
        else f"{test['most']} launches"
    )
    read = len(looks(section))
    level = f"{1 - _look_alpha(section):.4g}".rstrip("0")
    per_look = f" over {read} looks" if read > 1 else ""
    name = "the mean" if test["test"] == "t" else "the median"
    how = "a one-sample t-test" if test["test"] == "t" else "a sign test"
    high = test["threshold"] + test["effect"]
    return (
        f"judged from repeated launches by {how} of {name} of `{test['metric']}`: reproduced "
        f"when its {level} interval lies above {test['threshold']:g}, clean when it lies "
        f"below {high:g} (threshold {test['threshold']:g}, effect {test['effect']:g}, alpha "
        f"{test['alpha']:g}{per_look}, beta {test['beta']:g}; {launches})"
    )
