"""Bisection logic with injected probes: no environments, no ranks."""

from __future__ import annotations

import math

import pytest

from reprobox.bisect.search import SearchError, bisect, ddmin
from reprobox.core.protocol import Verdict

R, C = Verdict.REPRODUCED, Verdict.CLEAN


def fix_at(
    first_clean: int, skip: frozenset[int] = frozenset(), flaky: frozenset[int] = frozenset()
):
    calls: list[tuple[int, int]] = []

    def probe(item: int, attempt: int) -> Verdict | None:
        calls.append((item, attempt))
        if item in skip:
            return None
        verdict = C if item >= first_clean else R
        if item in flaky and attempt > 1:
            return R if verdict is C else C
        return verdict

    return probe, calls


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 9, 16, 33, 100])
def test_finds_every_boundary_within_the_probe_bound(n: int) -> None:
    items = list(range(n))
    for first in range(1, n):
        probe, calls = fix_at(first)
        result = bisect(items, probe, confirm=0)
        assert (result.status, result.first_end, result.last_start) == ("found", first, first - 1)
        assert len({item for item, _ in calls}) <= math.ceil(math.log2(n)) + 2
        assert result.start_verdict is R and result.end_verdict is C


def test_regressions_are_found_too() -> None:
    def probe(item: int, attempt: int) -> Verdict:
        return R if item >= 6 else C

    result = bisect(list(range(10)), probe, confirm=0)
    assert result.first_end == 6 and result.end_verdict is R


def test_skips_widen_the_answer_instead_of_guessing() -> None:
    probe, _ = fix_at(5, skip=frozenset({3, 4}))
    result = bisect(list(range(10)), probe, confirm=0)
    assert result.status == "ambiguous"
    assert result.candidates == [3, 4, 5]
    probe, _ = fix_at(5, skip=frozenset({4}))  # a skipped middle is replaced by a neighbour
    result = bisect(list(range(10)), probe, confirm=0)
    assert result.status == "ambiguous" and result.candidates == [4, 5]
    probe, _ = fix_at(7, skip=frozenset({4}))
    assert bisect(list(range(10)), probe, confirm=0).first_end == 7


def test_boundary_probes_are_repeated_and_flakiness_reported() -> None:
    probe, calls = fix_at(5)
    result = bisect(list(range(10)), probe, confirm=2)
    assert result.status == "found"
    assert calls.count((4, 3)) == 1 and calls.count((5, 3)) == 1
    probe, _ = fix_at(5, flaky=frozenset({5}))
    result = bisect(list(range(10)), probe, confirm=1)
    assert result.status == "flaky" and result.flaky == [5]


def test_endpoints_must_be_testable_and_differ() -> None:
    probe, _ = fix_at(100)
    with pytest.raises(SearchError, match=r"both ends .* are reproduced: nothing to bisect"):
        bisect(list(range(5)), probe)
    probe, _ = fix_at(2, skip=frozenset({0}))
    with pytest.raises(SearchError, match="endpoint 0 cannot be tested"):
        bisect(list(range(5)), probe)
    with pytest.raises(SearchError, match="at least two"):
        bisect([1], probe)


def test_prefetch_hears_what_comes_next() -> None:
    heard: list[list[int]] = []
    probe, calls = fix_at(11)
    bisect(list(range(32)), probe, confirm=0, prefetch=heard.append)
    probed = [item for item, _ in calls][2:]
    for announced, following in zip(heard, probed[1:], strict=False):
        assert following in announced


def test_ddmin_finds_a_single_culprit() -> None:
    tried: list[list[str]] = []

    def flips(subset: list[str]) -> bool:
        tried.append(subset)
        return "trl" in subset

    changes = ["accelerate", "datasets", "numpy", "pyarrow", "tokenizers", "trl", "tyro", "xxhash"]
    assert ddmin(changes, flips) == ["trl"]
    assert len(tried) <= 2 * math.ceil(math.log2(len(changes))) + 2


def test_ddmin_keeps_a_pair_that_only_flips_together() -> None:
    def flips(subset: list[str]) -> bool:
        return {"transformers", "accelerate"} <= set(subset)

    changes = ["accelerate", "datasets", "numpy", "transformers", "tyro"]
    assert sorted(ddmin(changes, flips)) == ["accelerate", "transformers"]


def test_ddmin_treats_untestable_combinations_as_not_flipping() -> None:
    def flips(subset: list[str]) -> bool | None:
        if subset == ["trl"]:
            return None  # e.g. trl 0.7.2 alone cannot resolve without tyro
        return {"trl", "tyro"} <= set(subset)

    assert sorted(ddmin(["numpy", "trl", "tyro"], flips)) == ["trl", "tyro"]
