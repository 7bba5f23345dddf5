"""The statistical verdict of a noisy repro: how many launches say what, with what error.

A noisy outcome is never judged from one launch. Pass/fail outcomes go through Wald's
sequential probability ratio test (SPRT) between "clean" (reproduces at most at `floor`, the
false-reproduction rate a fixed release may still show) and "reproduced" (at least `floor +
effect`, the smallest rate that matters): the SPRT may be read after every launch without
inflating its error rates, so "undecided: run more" is an honest, cheap answer. The figures
beside the decision are the exact one-sided binomial p-value against `floor` and the
Clopper-Pearson interval. Metrics get a one-sample t-test (with its interval and an
equivalence reading for "same"), a sign test, and Mann-Whitney U for broken-vs-fixed samples.

Pure Python (no scipy, no numpy): the distributions are written here and tested against
published values in tests/test_stats.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Decision(StrEnum):
    REPRODUCED = "reproduced"
    CLEAN = "clean"
    UNDECIDED = "undecided"  # run more


class Comparison(StrEnum):
    DIFFERENT = "different"
    SAME = "same"  # within the smallest effect that matters, at the stated confidence
    UNDECIDED = "undecided"


# -- distributions ----------------------------------------------------------------------------


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def binom_pmf(k: int, n: int, p: float) -> float:
    """P(X = k) for X ~ Binomial(n, p), exact at p = 0 and p = 1."""
    if k < 0 or k > n:
        return 0.0
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    if p >= 1.0:
        return 1.0 if k == n else 0.0
    return math.exp(_log_choose(n, k) + k * math.log(p) + (n - k) * math.log1p(-p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, math.fsum(binom_pmf(i, n, p) for i in range(k + 1)))


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k): the exact one-sided p-value of k or more reproductions."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, math.fsum(binom_pmf(i, n, p) for i in range(k, n + 1)))


def _solve(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f, by bisection (80 halvings:
    far below any figure printed)."""
    for _ in range(80):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (conservative) two-sided interval for a binomial rate: never narrower than
    the data allow, also at 0 of n and n of n."""
    if n <= 0:
        return 0.0, 1.0
    tail = (1 - confidence) / 2
    lo = 0.0 if k == 0 else _solve(lambda p: binom_sf(k, n, p), 0.0, 1.0, tail)
    hi = 1.0 if k == n else _solve(lambda p: -binom_cdf(k, n, p), 0.0, 1.0, -tail)
    return lo, hi


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval (shorter than Clopper-Pearson, close to nominal coverage)."""
    if n <= 0:
        return 0.0, 1.0
    z = norm_ppf(1 - (1 - confidence) / 2)
    rate = k / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def norm_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def norm_ppf(q: float) -> float:
    """The standard normal quantile."""
    if not 0 < q < 1:
        raise ValueError(f"quantile {q} is outside (0, 1)")
    return _solve(norm_cdf, -40.0, 40.0, q)


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta I_x(a, b), by its continued fraction (modified Lentz),
    on the side where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """Student's t quantile."""
    if not 0 < q < 1:
        raise ValueError(f"quantile {q} is outside (0, 1)")
    return _solve(lambda t: t_cdf(t, df), -1e4, 1e4, q)


# -- pass/fail: reproduced, clean, or run more ------------------------------------------------


@dataclass(frozen=True)
class PassFail:
    """What n launches with k reproductions allow one to say, and the figures behind it."""

    decision: Decision
    reproduced: int  # k
    runs: int  # n
    rate: float  # k / n
    ci: tuple[float, float]  # Clopper-Pearson, at 1 - alpha
    p_value: float  # exact one-sided P(>= k reproductions | rate = floor)
    llr: float  # log likelihood ratio, reproduced-at-floor+effect over clean-at-floor
    more: int  # undecided: the fewest further launches that could decide it (0 otherwise)
    test: str  # the stated test, in words


def pass_fail(
    reproduced: int,
    runs: int,
    *,
    floor: float = 0.0,
    effect: float = 0.5,
    alpha: float = 0.01,
    beta: float = 0.01,
) -> PassFail:
    """Wald's SPRT of rate <= floor (clean) against rate >= floor + effect (reproduced), with
    error rates alpha (a clean release called reproduced) and beta (the other way round).

    Its boundaries hold however often it is read, so a caller may run one launch at a time
    and stop as soon as it decides. With floor 0 one reproduction decides: a fixed release
    never reproduces, by assumption; say a floor when that is not so."""
    if not 0 <= reproduced <= runs:
        raise ValueError(f"{reproduced} reproductions in {runs} runs")
    high = floor + effect
    if not (0 <= floor < high <= 1) or not (0 < alpha < 0.5 and 0 < beta < 0.5):
        raise ValueError("need 0 <= floor < floor + effect <= 1, alpha and beta in (0, 0.5)")
    up, down = math.log((1 - beta) / alpha), math.log(beta / (1 - alpha))
    step_k = math.inf if floor == 0 else math.log(high / floor)  # per reproduction
    step_c = -math.inf if high == 1 else math.log((1 - high) / (1 - floor))  # per clean run
    clean = runs - reproduced
    llr = (reproduced * step_k if reproduced else 0.0) + (clean * step_c if clean else 0.0)
    if llr >= up:
        decision, more = Decision.REPRODUCED, 0
    elif llr <= down:
        decision, more = Decision.CLEAN, 0
    else:
        need_k = 1 if math.isinf(step_k) else math.ceil((up - llr) / step_k - 1e-12)
        need_c = 1 if math.isinf(step_c) else math.ceil((down - llr) / step_c - 1e-12)
        decision, more = Decision.UNDECIDED, max(1, min(need_k, need_c))
    test = (
        f"SPRT: rate <= {floor:g} (clean) vs >= {high:g} (reproduced), "
        f"alpha {alpha:g}, beta {beta:g}"
    )
    return PassFail(
        decision=decision,
        reproduced=reproduced,
        runs=runs,
        rate=reproduced / runs if runs else math.nan,
        ci=clopper_pearson(reproduced, runs, 1 - alpha),
        p_value=binom_sf(reproduced, runs, floor),
        llr=llr,
        more=more,
        test=test,
    )


# -- metrics ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricTest:
    """A stated test on a metric's samples: the estimate, its interval, the p-value."""

    decision: Comparison
    estimate: float  # the mean (t-test), the median (sign test), U (Mann-Whitney)
    ci: tuple[float, float] | None
    statistic: float
    p_value: float  # two-sided
    n: int
    test: str


def t_test(
    values: Sequence[float], *, mu: float = 0.0, alpha: float = 0.01, effect: float | None = None
) -> MetricTest:
    """One-sample two-sided t-test of mean = mu with its (1 - alpha) interval: "different" when
    the interval excludes mu, "same" when it lies inside mu +- effect (an equivalence reading;
    without an effect a test never says same), else undecided."""
    n = len(values)
    if n < 2:
        raise ValueError("a t-test needs at least two values")
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    se = sd / math.sqrt(n)
    df = n - 1
    if se == 0:
        t, p = (0.0, 1.0) if mean == mu else (math.copysign(math.inf, mean - mu), 0.0)
    else:
        t = (mean - mu) / se
        p = 2 * t_cdf(-abs(t), df)
    half = t_ppf(1 - alpha / 2, df) * se
    ci = (mean - half, mean + half)
    if not ci[0] <= mu <= ci[1]:
        decision = Comparison.DIFFERENT
    elif effect is not None and mu - effect < ci[0] and ci[1] < mu + effect:
        decision = Comparison.SAME
    else:
        decision = Comparison.UNDECIDED
    return MetricTest(decision, mean, ci, t, p, n, f"one-sample t-test (df {df}), mean = {mu:g}")


MAX_PLANNED = 100_000  # the most launches a power calculation names


def t_launches(sd: float, effect: float, *, alpha: float, beta: float) -> int:
    """The power calculation of a one-sample t-test read through its (1 - alpha) interval:
    the fewest n with (t(1 - alpha/2, n-1) + t(1 - beta, n-1)) * sd / sqrt(n) <= effect,
    so a mean `effect` away from the value tested has its interval clear of that value
    with chance >= 1 - beta (at a true sd of `sd`). MAX_PLANNED when no n is enough."""
    if sd <= 0:
        return 2
    if effect <= 0:
        return MAX_PLANNED
    z = norm_ppf(1 - alpha / 2) + norm_ppf(1 - beta)
    n = max(2, math.ceil((z * sd / effect) ** 2))  # the normal's n: the t's is never fewer
    while n < MAX_PLANNED:
        if (t_ppf(1 - alpha / 2, n - 1) + t_ppf(1 - beta, n - 1)) * sd / math.sqrt(n) <= effect:
            return n
        n += max(1, n // 50)  # within 2% of the fewest: a plan, not a verdict
    return MAX_PLANNED


def sd_lower(sd: float, df: int, confidence: float = 0.95) -> float:
    """A one-sided lower confidence bound of a normal sample's sd, from its chi-square
    (Wilson-Hilferty's cube-root approximation of the quantile, within 1% from df 3 on):
    how small the spread may still be."""
    if df < 1:
        return 0.0
    z = norm_ppf(confidence)
    chi2 = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return sd * math.sqrt(df / chi2)


def sign_test(values: Sequence[float], *, mu: float = 0.0, alpha: float = 0.01) -> MetricTest:
    """The exact two-sided sign test of median = mu (ties with mu dropped): assumes nothing
    of the distribution but independence. The interval is the order statistics' one for the
    median at >= 1 - alpha."""
    signs = [v - mu for v in values if v != mu]
    n, above = len(signs), sum(1 for s in signs if s > 0)
    if n == 0:
        return MetricTest(Comparison.UNDECIDED, mu, None, 0.0, 1.0, 0, "sign test: all ties")
    p = min(1.0, 2 * min(binom_cdf(above, n, 0.5), binom_sf(above, n, 0.5)))
    ordered = sorted(values)
    m = len(ordered)
    # the largest r with P(X < r) <= alpha / 2 gives [x_(r), x_(m - r + 1)]
    r = 0
    while r + 1 <= m // 2 and binom_cdf(r, m, 0.5) <= alpha / 2:
        r += 1
    ci = (ordered[r - 1], ordered[m - r]) if r >= 1 else None
    median = (ordered[(m - 1) // 2] + ordered[m // 2]) / 2
    decision = Comparison.DIFFERENT if p <= alpha else Comparison.UNDECIDED
    return MetricTest(decision, median, ci, float(above), p, n, f"sign test, median = {mu:g}")


def mann_whitney(a: Sequence[float], b: Sequence[float], *, alpha: float = 0.01) -> MetricTest:
    """Mann-Whitney U (two-sided) for broken-vs-fixed samples: exact for small samples without
    ties, else the normal approximation with tie and continuity corrections. A rank test can
    show a difference, not sameness: "different" or undecided."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney needs values on both sides")
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks: list[float] = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        size = j - i + 1
        ties += size**3 - size
        i = j + 1
    r1 = math.fsum(r for r, (_, side) in zip(ranks, pooled, strict=True) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    if ties == 0 and n1 + n2 <= 40:
        p, how = _mw_exact(u, n1, n2), "exact"
    else:
        n = n1 + n2
        var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
        centred = abs(u - n1 * n2 / 2) - 0.5
        p = 1.0 if var <= 0 else min(1.0, 2 * norm_cdf(-max(centred, 0) / math.sqrt(var)))
        how = "normal approximation"
    decision = Comparison.DIFFERENT if p <= alpha else Comparison.UNDECIDED
    return MetricTest(decision, u, None, u, p, n1 + n2, f"Mann-Whitney U, two-sided ({how})")


def _mw_exact(u: float, n1: int, n2: int) -> float:
    """Two-sided exact p of U: counts of rank arrangements by U, by dynamic programming."""
    # counts[i][j]: the number of arrangements of i + j values giving each U
    table: dict[tuple[int, int], list[int]] = {}

    def counts(i: int, j: int) -> list[int]:
        if i == 0 or j == 0:
            return [1]
        if (i, j) not in table:
            left, right = counts(i - 1, j), counts(i, j - 1)  # the largest is from a / from b
            out = [0] * (i * j + 1)
            for s, c in enumerate(left):
                out[s + j] += c
            for s, c in enumerate(right):
                out[s] += c
            table[(i, j)] = out
        return table[(i, j)]

    dist = counts(n1, n2)
    total = math.comb(n1 + n2, n1)
    low = min(u, n1 * n2 - u)
    tail = sum(c for s, c in enumerate(dist) if s <= low + 1e-9)
    return min(1.0, 2 * tail / total)
