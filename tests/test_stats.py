"""core.stats: the distributions against published values (scipy's, to the digits shown), the
pass/fail SPRT's decisions and its error rates by simulation, the metric tests."""

from __future__ import annotations

import random

import pytest

from reprobox.core import stats
from reprobox.core.stats import Comparison, Decision


def test_distributions_match_known_values() -> None:
    assert stats.t_ppf(0.975, 10) == pytest.approx(2.228138851986274, rel=1e-10)
    assert stats.t_ppf(0.995, 15) == pytest.approx(2.946712883475479, rel=1e-10)
    assert stats.t_cdf(2.0, 5) == pytest.approx(0.9490302605850709, rel=1e-12)
    assert stats.t_cdf(-1.5, 2.5) == pytest.approx(1 - stats.t_cdf(1.5, 2.5), rel=1e-12)
    assert stats.norm_ppf(0.975) == pytest.approx(1.959963984540054, rel=1e-12)
    assert stats.betainc(2, 3, 0.4) == pytest.approx(0.5248, rel=1e-12)
    assert stats.betainc(0.5, 0.5, 0.9) == pytest.approx(0.7951672353008665, rel=1e-10)
    assert stats.binom_pmf(3, 10, 0.3) == pytest.approx(0.26682793200000005, rel=1e-12)
    assert stats.binom_cdf(3, 10, 0.3) == pytest.approx(0.6496107184000001, rel=1e-12)
    assert stats.binom_sf(4, 10, 0.3) == pytest.approx(1 - 0.6496107184000001, rel=1e-12)
    assert stats.binom_sf(1, 5, 0.0) == 0.0 and stats.binom_pmf(5, 5, 1.0) == 1.0


def test_intervals_match_known_values() -> None:
    lo, hi = stats.clopper_pearson(5, 10)
    assert (lo, hi) == pytest.approx((0.18708602844739, 0.81291397155261), rel=1e-9)
    assert stats.clopper_pearson(0, 10) == pytest.approx((0.0, 0.3084971078187608), rel=1e-9)
    assert stats.clopper_pearson(10, 10)[0] == pytest.approx(0.6915028921812392, rel=1e-9)
    assert stats.wilson(5, 10) == pytest.approx((0.2365930905, 0.7634069095), rel=1e-8)
    assert stats.clopper_pearson(0, 0) == (0.0, 1.0)


def test_sprt_decides_clean_reproduced_or_run_more() -> None:
    # floor 0: one reproduction proves it; seven clean runs rule out a rate >= 0.5 at 1%
    assert stats.pass_fail(1, 1).decision is Decision.REPRODUCED
    assert stats.pass_fail(0, 6).decision is Decision.UNDECIDED
    assert stats.pass_fail(0, 6).more == 1
    clean = stats.pass_fail(0, 7)
    assert clean.decision is Decision.CLEAN and clean.ci[1] < 0.55 and clean.p_value == 1.0
    # a 5% false-reproduction floor: 3 of 10 is neither, and says how many more could decide
    mid = stats.pass_fail(3, 10, floor=0.05)
    assert mid.decision is Decision.UNDECIDED and mid.more == 2
    assert mid.p_value == pytest.approx(stats.binom_sf(3, 10, 0.05))
    assert "SPRT" in mid.test and "alpha 0.01" in mid.test
    assert stats.pass_fail(8, 10, floor=0.05).decision is Decision.REPRODUCED
    with pytest.raises(ValueError):
        stats.pass_fail(3, 2)
    with pytest.raises(ValueError):
        stats.pass_fail(1, 2, floor=0.6, effect=0.5)


@pytest.mark.parametrize(("rate", "wrong"), [(0.05, Decision.REPRODUCED), (0.55, Decision.CLEAN)])
def test_sprt_read_after_every_run_keeps_its_error_rate(rate: float, wrong: Decision) -> None:
    """Read after each launch (as a caller stopping early does), at the hypotheses' rates:
    wrong decisions stay at about alpha = beta = 1% (Wald's bound allows a little over)."""
    rng = random.Random(7)
    errors = 0
    trials = 1000
    for _ in range(trials):
        k = n = 0
        while True:
            n += 1
            k += rng.random() < rate
            decided = stats.pass_fail(k, n, floor=0.05).decision
            if decided is not Decision.UNDECIDED:
                errors += decided is wrong
                break
    assert errors / trials <= 0.02


def test_t_test_interval_and_three_readings() -> None:
    out = stats.t_test([1.0, 2, 3, 4, 5])
    assert out.statistic == pytest.approx(4.242640687119285)
    assert out.p_value == pytest.approx(0.013236, rel=1e-4)  # scipy.stats.ttest_1samp
    assert out.decision is Comparison.UNDECIDED  # p > alpha 0.01
    assert out.ci == pytest.approx((3 - 4.604094 * 0.707107, 3 + 4.604094 * 0.707107), rel=1e-5)
    assert stats.t_test([1.0, 2, 3, 4, 5], alpha=0.05).decision is Comparison.DIFFERENT
    near = [0.001 * (i % 3 - 1) for i in range(30)]
    assert stats.t_test(near, effect=0.01).decision is Comparison.SAME
    assert stats.t_test(near).decision is Comparison.UNDECIDED  # no effect stated: never same


def test_sign_and_rank_tests() -> None:
    out = stats.sign_test([1.0] * 10)
    assert out.p_value == pytest.approx(2 / 1024) and out.decision is Comparison.DIFFERENT
    assert stats.sign_test([0.0, 0.0]).decision is Comparison.UNDECIDED
    exact = stats.mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert exact.statistic == 0 and exact.p_value == pytest.approx(2 / 252)
    assert "exact" in exact.test and exact.decision is Comparison.DIFFERENT
    # ties: the normal approximation, tie-corrected variance 3 * (13 - 60 / 132), continuity
    # 0.5: z = 14.5 / 6.1348 (scipy mannwhitneyu, method="asymptotic", gives the same)
    tied = stats.mann_whitney([1, 2, 2, 3, 3, 4], [3, 4, 4, 5, 5, 6])
    assert tied.statistic == 3.0 and tied.p_value == pytest.approx(0.0181009, rel=1e-4)
    assert tied.decision is Comparison.UNDECIDED
