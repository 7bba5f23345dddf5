"""A simulated clock for the parallel search: probes take scripted times, the runner hands
back whichever ends first, and a round is one unit of time when every probe takes one.
Used by tests/test_multisection.py and tests/bench/bench_parallel.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reprobox.bisect.search import Job, Probe
from reprobox.core.protocol import Verdict

T = TypeVar("T")


@dataclass
class SimulatedRunner(Generic[T]):
    """Runs each probe at the simulated moment it ends (in start order among equal ends).

    `duration(item, attempt)` is how long it takes (1.0 by default); `now` is the clock;
    `peak` the most probes that ran at once; `starts` every (time, item, attempt) started."""

    probe: Probe[T]
    workers: int
    duration: Callable[[T, int], float] = lambda item, attempt: 1.0
    now: float = 0.0
    peak: int = 0
    starts: list[tuple[float, T, int]] = field(default_factory=list)
    aborted: bool | None = None
    _running: list[tuple[float, int, Job[T]]] = field(default_factory=list)
    _serial: int = 0

    def start(self, job: Job[T]) -> None:
        self._serial += 1
        self._running.append((self.now + self.duration(job.item, job.attempt), self._serial, job))
        self.starts.append((self.now, job.item, job.attempt))
        self.peak = max(self.peak, len(self._running))
        assert len(self._running) <= self.workers, "more probes at once than workers"

    def wait(self) -> list[tuple[Job[T], Verdict | None]]:
        assert self._running, "wait() with nothing running"
        self._running.sort(key=lambda r: (r[0], r[1]))
        end = self._running[0][0]
        ending = [r for r in self._running if r[0] == end]
        self._running = [r for r in self._running if r[0] != end]
        self.now = end
        return [(job, self.probe(job.item, job.attempt)) for _, _, job in ending]

    def abort(self, interrupted: bool) -> None:
        self.aborted = interrupted
        self._running.clear()


def history(
    first_end: int,
    *,
    skip: frozenset[int] = frozenset(),
    flaky: frozenset[int] = frozenset(),
    flips: frozenset[int] = frozenset(),
    start: Verdict = Verdict.REPRODUCED,
) -> tuple[Probe[int], list[tuple[int, int]]]:
    """Item i gives `start` below `first_end`, the other verdict from there on; `skip` cannot
    be tested; `flaky` flip on re-runs; `flips` give the other side's verdict (non-monotone)."""
    other = Verdict.CLEAN if start is Verdict.REPRODUCED else Verdict.REPRODUCED
    calls: list[tuple[int, int]] = []

    def probe(item: int, attempt: int) -> Verdict | None:
        calls.append((item, attempt))
        if item in skip:
            return None
        verdict = other if item >= first_end else start
        if item in flips:
            verdict = start if verdict is other else other
        if item in flaky and attempt > 1:
            return start if verdict is other else other
        return verdict

    return probe, calls
