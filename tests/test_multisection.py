"""The parallel search (multisection) with injected probes and a simulated clock: no
environments, no ranks. The same rules as `bisect`: skips widen, re-runs catch flakiness,
a contradiction is reported, never hidden."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import pytest
from multisect_fakes import SimulatedRunner, history

from conftest import newest_records, reprobox
from reprobox.bisect.search import (
    SearchError,
    ThreadRunner,
    bisect,
    multisect,
    rounds_bound,
)
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.run.backends import detached

R, C = Verdict.REPRODUCED, Verdict.CLEAN


def simulated(n: int, workers: int, probe, confirm: int = 0, duration=None):  # type: ignore[no-untyped-def]
    runner = (
        SimulatedRunner(probe, workers)
        if duration is None
        else SimulatedRunner(probe, workers, duration)
    )
    result = multisect(list(range(n)), probe, workers=workers, confirm=confirm, runner=runner)
    return result, runner


def test_the_rounds_bound() -> None:
    assert [rounds_bound(8, k) for k in (1, 2, 4)] == [5, 4, 4]
    assert [rounds_bound(32, k) for k in (1, 2, 4)] == [7, 6, 5]
    assert [rounds_bound(128, k) for k in (1, 2, 4)] == [9, 7, 6]
    assert rounds_bound(9, 2) == 4 and rounds_bound(10, 2) == 5  # 3**2 = 9: exact powers


@pytest.mark.parametrize("confirm", [0, 1, 2])
def test_one_worker_probes_exactly_what_bisect_does(confirm: int) -> None:
    for n in (2, 3, 5, 8, 13, 33):
        for first in range(1, n):
            for skip in (frozenset(), frozenset({first - 1, first + 1}) - {0, n - 1}):
                for flaky in (frozenset(), frozenset({first})):
                    serial, serial_calls = history(first, skip=skip, flaky=flaky)
                    expected = bisect(list(range(n)), serial, confirm=confirm)
                    probe, calls = history(first, skip=skip, flaky=flaky)
                    got, _ = simulated(n, 1, probe, confirm)
                    assert calls == serial_calls, (n, first, skip, flaky)
                    assert (got.status, got.candidates, got.flaky) == (
                        expected.status, expected.candidates, expected.flaky
                    )  # fmt: skip


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_every_boundary_is_found_within_the_rounds_bound(workers: int) -> None:
    for n in [*range(2, 40), 64, 100, 128, 130]:
        for first in range(1, n):
            probe, calls = history(first)
            result, runner = simulated(n, workers, probe)
            assert (result.status, result.last_start, result.first_end) == (
                "found", first - 1, first
            )  # fmt: skip
            assert runner.now <= rounds_bound(n, workers), (n, first, runner.now)
            assert runner.peak <= workers
            assert len(calls) == len(set(calls))  # no probe twice


def test_the_ends_run_in_the_same_round_and_k_points_cut_k_plus_one_parts() -> None:
    probe, _ = history(20)
    _, runner = simulated(31, 2, probe)
    at = {}
    for when, item, _attempt in runner.starts:
        at.setdefault(when, []).append(item)
    assert at[0.0] == [0, 30]  # both ends, first round
    assert at[1.0] == [10, 20]  # two points, three equal parts of 0..30
    assert at[2.0] == [13, 17]  # the part 10..20 (the flip is there), cut in three again
    _, wide = simulated(31, 4, history(20)[0])
    assert [i for w, i, _ in wide.starts if w == 0.0] == [0, 30, 10, 20]  # spare workers start


def test_a_result_that_arrives_early_narrows_the_range_at_once() -> None:
    probe, _ = history(25)

    def duration(item: int, attempt: int) -> float:
        return 10.0 if item == 10 else 1.0  # one slow probe in the second round

    result, runner = simulated(31, 2, probe, duration=duration)
    assert result.first_end == 25
    # 20 ends at t=2 (reproduced: the range is now 20..30) and the freed worker starts the
    # next point at once, long before the slow probe of 10 ends at t=11
    second = [(w, i) for w, i, _ in runner.starts if 1.0 < w < 11.0]
    assert second and second[0] == (2.0, 25)
    assert runner.now == 11.0  # the left-behind probe still ends before the answer


def test_a_left_behind_probe_that_contradicts_its_side_is_reported() -> None:
    probe, _ = history(25, flips=frozenset({10}))  # 10 is clean amid reproducing releases

    def duration(item: int, attempt: int) -> float:
        return 5.0 if item == 10 else 1.0

    result, _ = simulated(31, 2, probe, duration=duration)
    assert result.first_end == 25
    assert result.contradictions == [(10, C, R)]


def test_skips_widen_the_answer_as_bisect_does() -> None:
    probe, _ = history(5, skip=frozenset({3, 4}))
    result, _ = simulated(10, 2, probe)
    assert result.status == "ambiguous" and result.candidates == [3, 4, 5]
    probe, _ = history(7, skip=frozenset({4}))
    assert simulated(10, 3, probe)[0].first_end == 7


def test_confirmations_start_when_a_worker_is_free_and_flakiness_is_reported() -> None:
    probe, calls = history(5)
    result, runner = simulated(10, 2, probe, confirm=2)
    assert result.status == "found"
    assert calls.count((4, 3)) == 1 and calls.count((5, 3)) == 1
    probe, _ = history(5, flaky=frozenset({5}))
    result, _ = simulated(10, 2, probe, confirm=1)
    assert result.status == "flaky" and result.flaky == [5]
    # two items, two workers: both ends, then both confirmations, in two rounds
    probe, calls = history(1)
    result, runner = simulated(2, 2, probe, confirm=1)
    assert result.status == "found" and runner.now == 2.0


def test_endpoints_must_be_testable_and_differ() -> None:
    probe, _ = history(100)
    runner = SimulatedRunner(probe, 2)
    with pytest.raises(SearchError, match=r"both ends .* are reproduced: nothing to bisect"):
        multisect(list(range(5)), probe, workers=2, runner=runner)
    assert runner.aborted is False  # an error, not an interrupt: nothing to stop
    probe, _ = history(2, skip=frozenset({4}))
    with pytest.raises(SearchError, match="endpoint 4 cannot be tested"):
        multisect(list(range(5)), probe, workers=2, runner=SimulatedRunner(probe, 2))
    with pytest.raises(SearchError, match="at least two"):
        multisect([1], probe, workers=2)
    with pytest.raises(BadInput, match="--workers: must be 1 or more, not 0"):
        multisect([1, 2], probe, workers=0)


def test_an_interrupt_stops_every_probe_and_propagates() -> None:
    def probe(item: int, attempt: int) -> Verdict:
        if item == 31:
            raise KeyboardInterrupt
        return R

    runner = SimulatedRunner(probe, 2)
    with pytest.raises(KeyboardInterrupt):
        multisect(list(range(32)), probe, workers=2, runner=runner)
    assert runner.aborted is True


def test_threads_run_k_probes_at_once_and_agree_with_the_simulation() -> None:
    lock = threading.Lock()
    live, peak = [0], [0]
    base, _ = history(37)

    def probe(item: int, attempt: int) -> Verdict | None:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.01 * (1 + item % 3))
        with lock:
            live[0] -= 1
        return base(item, attempt)

    result = multisect(list(range(64)), probe, workers=3, confirm=1)
    assert (result.status, result.first_end) == ("found", 37)
    assert peak[0] == 3


def test_threads_finish_what_runs_before_a_stop_or_an_interrupt_propagates() -> None:
    ended: list[int] = []
    stopped = threading.Event()

    def probe(item: int, attempt: int) -> Verdict:
        if item == 0:
            time.sleep(0.2)
            ended.append(item)
            return R
        raise RuntimeError("probe 31 crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        multisect(list(range(32)), probe, workers=2)
    assert ended == [0]  # the other probe was waited for, so its verdict is in the log

    def slow(item: int, attempt: int) -> Verdict:
        if item == 0:
            stopped.wait(5)
            ended.append(-1 if stopped.is_set() else 0)
            return R
        raise KeyboardInterrupt

    runner = ThreadRunner(slow, 2, on_interrupt=stopped.set)
    ended.clear()
    with pytest.raises(KeyboardInterrupt):
        multisect(list(range(32)), slow, workers=2, runner=runner)
    assert ended == [-1]  # told to stop, then waited for


@pytest.mark.e2e
def test_two_local_workers_run_two_launches_at_once_each_on_its_own(toy_root: Path) -> None:
    """`run --matrix --workers 2` on this machine: the launches overlap in time, each in its
    own runner process, on its own port and in its own run folder, and every verdict is the
    one the matrix expects."""
    done = reprobox("run", "toy", "--matrix", "--workers", "2")
    assert done.returncode == 0, done.stderr
    records = newest_records(toy_root / "results", "toy")
    assert len(records) == 4 and {r["status"] for r in records.values()} == {"match"}
    outcomes = [
        json.loads((Path(r["dir"]) / detached.OUTCOME_NAME).read_text()) for r in records.values()
    ]
    assert len({o["port"] for o in outcomes}) == 4
    assert len({o["pid"] for o in outcomes}) == 4
    assert len({r["dir"] for r in records.values()}) == 4
    spans = sorted((o["started_at"], o["ended_at"]) for o in outcomes)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
