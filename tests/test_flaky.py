"""bisect.flaky: the flake-aware boundary search on simulated histories (seeded, fast)."""

from __future__ import annotations

import random

import pytest

from reprobox.bisect.flaky import FlakyAnswer, flaky_search
from reprobox.core.protocol import Verdict


class History:
    """Releases 0..n-1; from `culprit` on (None: never) a probe reproduces with `rate`, before
    it with `false_rate`; `skip` cannot be tested."""

    def __init__(
        self,
        culprit: int | None,
        rate: float,
        false_rate: float = 0.0,
        seed: int = 0,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self.culprit, self.rate, self.false_rate, self.skip = culprit, rate, false_rate, skip
        self.rng = random.Random(seed)
        self.calls: list[tuple[int, int]] = []
        self.batches: list[int] = []

    def __call__(self, item: int, attempt: int) -> Verdict | None:
        self.calls.append((item, attempt))
        if item in self.skip:
            return None
        bad = self.culprit is not None and item >= self.culprit
        chance = self.rate if bad else self.false_rate
        return Verdict.REPRODUCED if self.rng.random() < chance else Verdict.CLEAN

    def batch(self, jobs: list[tuple[int, int]]) -> list[Verdict | None]:
        self.batches.append(len(jobs))
        return [self(item, attempt) for item, attempt in jobs]


def test_a_deterministic_history_is_found_in_about_log2_probes() -> None:
    history = History(culprit=37, rate=1.0)
    answer = flaky_search(list(range(64)), history)
    assert (answer.status, answer.culprit) == ("found", 37)
    assert answer.confidence >= 0.99 and answer.top == []
    # log2(64) + a few to be sure: the false rate is learnt, not assumed small, and the
    # answer needs 5 runs each side at 0.999 (21 here)
    assert answer.runs == len(history.calls) <= 6 + 16
    assert sum(prob for _, prob in answer.posterior) + answer.no_change == pytest.approx(1.0)


@pytest.mark.parametrize(("rate", "false_rate"), [(0.7, 0.0), (0.5, 0.05)])
def test_a_flaky_history_is_found_at_the_stated_confidence(rate: float, false_rate: float) -> None:
    rng = random.Random(3)
    right = 0
    for trial in range(40):
        culprit = rng.randrange(1, 16)
        answer = flaky_search(list(range(16)), History(culprit, rate, false_rate, seed=trial))
        right += answer.status == "found" and answer.culprit == culprit
        assert answer.status != "no_change"
    assert right >= 39


def test_it_reprobes_an_item_when_that_tells_the_most() -> None:
    answer = flaky_search(list(range(8)), History(culprit=5, rate=0.5, false_rate=0.05, seed=1))
    assert answer.culprit == 5
    assert max(runs for _, _, runs in answer.counts) > 1
    reproduced, runs = next((k, n) for item, k, n in answer.counts if item == 5)
    assert 0 < reproduced <= runs


def test_no_change_is_an_answer_both_ways() -> None:
    clean = flaky_search(list(range(32)), History(culprit=None, rate=0.7, false_rate=0.05))
    assert (clean.status, clean.throughout, clean.culprit) == ("no_change", "clean", None)
    assert clean.no_change == clean.confidence >= 0.99
    # the rate is learnt on both sides, so a rate of 0.7 throughout takes longer to tell
    # from a rise somewhere (1,313 runs here at 0.999): more than the default 300
    broken = flaky_search(list(range(32)), History(culprit=0, rate=0.7, seed=2), max_runs=3000)
    assert (broken.status, broken.throughout) == ("no_change", "reproduced")


def test_out_of_runs_it_names_the_leaders_instead_of_guessing() -> None:
    answer = flaky_search(
        list(range(32)), History(culprit=20, rate=0.5, false_rate=0.05, seed=4), max_runs=8
    )
    assert answer.status == "undecided" and answer.culprit is None and answer.runs == 8
    assert answer.confidence < 0.99 and 1 <= len(answer.top) <= 5
    probs = [prob for _, prob in answer.top]
    assert probs == sorted(probs, reverse=True) and answer.confidence == probs[0]


def test_a_skipped_neighbour_widens_the_answer() -> None:
    history = History(culprit=6, rate=1.0, skip=frozenset({5}))
    answer = flaky_search(list(range(12)), history, max_runs=60)
    assert [item for item, _ in history.calls].count(5) == 1  # never asked again
    assert answer.status == "undecided"
    assert {item for item, _ in answer.top} == {5, 6}
    assert sum(prob for _, prob in answer.top) >= 0.99


def test_same_seed_same_search_and_it_resumes_from_observations() -> None:
    def run(**kw: object) -> FlakyAnswer[int]:
        return flaky_search(list(range(20)), History(9, 0.7, 0.05, seed=5), seed=11, **kw)  # type: ignore[arg-type]

    first, again = run(), run()
    assert first.observations == again.observations and first.culprit == 9
    part = run(max_runs=6)
    assert part.status == "undecided" and len(part.observations) == 6
    read = flaky_search(list(range(20)), observations=part.observations, max_runs=0)
    assert read.posterior == part.posterior and read.runs == 6
    resumed = flaky_search(
        list(range(20)), History(9, 0.7, 0.05, seed=6), observations=part.observations
    )
    assert resumed.observations[:6] == part.observations and resumed.runs > 6
    assert (resumed.status, resumed.culprit) == ("found", 9)
    # attempts count on from the resumed observations
    assert all(attempt >= 1 for _, attempt in History(9, 0.7).calls)


def test_k_workers_probe_k_at_a_time_in_fewer_rounds() -> None:
    one, four = History(100, 1.0), History(100, 1.0)
    single = flaky_search(list(range(128)), probe_batch=one.batch)
    batched = flaky_search(list(range(128)), probe_batch=four.batch, workers=4)
    assert single.culprit == batched.culprit == 100
    assert set(one.batches) == {1} and set(four.batches[:-1]) == {4}
    assert len(four.batches) < len(one.batches) / 1.7  # rounds: ~log5 N against ~log2 N
    picked = [item for item, _ in four.calls[:4]]
    assert len(set(picked)) == 4  # one round's probes are spread, not the same best item


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="at least two"):
        flaky_search([1], History(0, 1.0))
    with pytest.raises(ValueError, match="not in the range"):
        flaky_search([1, 2, 3], History(2, 1.0), observations=[(7, True)])
    with pytest.raises(ValueError, match="confidence"):
        flaky_search([1, 2, 3], History(2, 1.0), confidence=1.0)
