"""Find where a verdict flips in an ordered history, and the smallest change that flips it.

Pure logic, in the manner of JAX-Toolbox's triage tool: the probe is injected, so the search
is tested without environments or GPUs. A probe returns a verdict, or None to skip (cannot
test here, cannot install) — skips widen the answer instead of guessing.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from reprobox.core.counts import check_count
from reprobox.core.protocol import Verdict

T = TypeVar("T")
# (item, attempt) -> verdict, or None to skip; attempt > 1 only for confirmation re-runs
Probe = Callable[[T, int], Verdict | None]


class SearchError(ValueError):
    """The question cannot be answered as asked (untestable or equal endpoints).

    A plain error, so this module stays free of the harness; the callers turn it into the
    harness's BadInput with advice fitting their kind of bisect.
    """

    def __init__(self, message: str, *, same_ends: bool = False) -> None:
        super().__init__(message)
        self.same_ends = same_ends  # both ends gave one verdict (the change may come and go)


@dataclass
class BisectResult(Generic[T]):
    status: str  # found | ambiguous | flaky
    start_verdict: Verdict
    end_verdict: Verdict
    last_start: T  # the newest item known to give the start verdict
    first_end: T  # the oldest item known to give the end verdict
    candidates: list[T]  # where the flip can be (one item when found)
    probes: list[tuple[T, int, Verdict | None]] = field(default_factory=list)
    flaky: list[T] = field(default_factory=list)
    # (item, verdict, expected): probes of a parallel search that the range had left behind
    # when they finished, and whose verdict contradicts the side they lie on
    contradictions: list[tuple[T, Verdict, Verdict]] = field(default_factory=list)


def bisect(
    items: Sequence[T],
    probe: Probe[T],
    *,
    confirm: int = 1,
    prefetch: Callable[[list[T]], None] | None = None,
) -> BisectResult[T]:
    """Binary search for the first item whose verdict differs from items[0]'s.

    Both ends are probed first and must give different verdicts. A skipped item is replaced
    by its nearest untried neighbour of the middle, as `git bisect skip` does; when only
    skipped items separate the two sides, the answer is the set of candidates. Finally the
    two boundary items are probed `confirm` more times; any disagreement is reported as
    flaky rather than guessed. `prefetch` hears the items the next step may probe.
    """
    if len(items) < 2:
        raise SearchError("need at least two items to bisect")
    probes: list[tuple[T, int, Verdict | None]] = []

    def run(index: int, attempt: int = 1) -> Verdict | None:
        verdict = probe(items[index], attempt)
        probes.append((items[index], attempt, verdict))
        return verdict

    first, last = run(0), run(len(items) - 1)
    if first is None or last is None:
        untestable = items[0] if first is None else items[-1]
        raise SearchError(f"endpoint {untestable} cannot be tested here")
    start, end = first, last
    if start is end:
        raise SearchError(
            f"both ends ({items[0]} and {items[-1]}) are {start.value}: nothing to bisect",
            same_ends=True,
        )

    lo, hi, skipped = 0, len(items) - 1, set[int]()
    while (mid := _middle(lo, hi, skipped)) is not None:
        if prefetch is not None:
            prefetch([items[i] for i in _next_middles(lo, mid, hi, skipped)])
        verdict = run(mid)
        if verdict is None:
            skipped.add(mid)
        elif verdict is start:
            lo = mid
        elif verdict is end:
            hi = mid

    flaky: list[T] = []
    for index, expected in ((lo, start), (hi, end)):
        for attempt in range(2, confirm + 2):
            if run(index, attempt) is not expected:
                flaky.append(items[index])
                break
    between = [items[i] for i in range(lo + 1, hi)]
    status = "flaky" if flaky else ("ambiguous" if between else "found")
    return BisectResult(
        status=status,
        start_verdict=start,
        end_verdict=end,
        last_start=items[lo],
        first_end=items[hi],
        candidates=[*between, items[hi]],
        probes=probes,
        flaky=flaky,
    )


def _middle(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untried, unskipped index closest to the middle of (lo, hi), if any."""
    inside = [i for i in range(lo + 1, hi) if i not in skipped]
    if not inside:
        return None
    centre = (lo + hi) / 2
    return min(inside, key=lambda i: (abs(i - centre), i))


def _next_middles(lo: int, mid: int, hi: int, skipped: set[int]) -> list[int]:
    """What the search probes after `mid`, whichever verdict `mid` gives."""
    found = [_middle(lo, mid, skipped), _middle(mid, hi, skipped)]
    return [i for i in found if i is not None]


# -- the parallel search: multisection --------------------------------------------------------


@dataclass(frozen=True)
class Job(Generic[T]):
    """One probe of a parallel search: where the item sits in the history, the item, the
    attempt (> 1 for a confirmation)."""

    index: int
    item: T
    attempt: int = 1


class Runner(Protocol[T]):
    """Runs probes in the background, never more at once than the search starts (threads in
    production, `ThreadRunner`; a simulated clock in tests)."""

    def start(self, job: Job[T]) -> None:
        """Begin `job` now."""
        ...

    def wait(self) -> list[tuple[Job[T], Verdict | None]]:
        """Block until at least one started job has ended; every ended job with its verdict,
        in the order they ended. A probe's exception is raised here."""
        ...

    def abort(self, interrupted: bool) -> None:
        """After an error (or, `interrupted`, Ctrl-C / SIGTERM: stop what runs first): wait
        for every started job to end. Never raises."""
        ...


class ThreadRunner(Generic[T]):
    """Probes on `workers` threads. On an interrupt `on_interrupt` is called (the back end
    stops its launches: kills local ranks, scancels Slurm jobs), then every thread is waited
    for, so nothing outlives the search and every finished probe is in the log."""

    def __init__(
        self, probe: Probe[T], workers: int, on_interrupt: Callable[[], None] | None = None
    ) -> None:
        self.workers = check_count("--workers", workers)
        self.probe, self.on_interrupt = probe, on_interrupt
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe")
        self._running: dict[Future[Verdict | None], Job[T]] = {}
        self._lock = threading.Lock()

    def start(self, job: Job[T]) -> None:
        future = self._pool.submit(self.probe, job.item, job.attempt)
        with self._lock:
            self._running[future] = job

    def wait(self) -> list[tuple[Job[T], Verdict | None]]:
        if not self._running:
            raise RuntimeError("wait() with no probe running")
        done: set[Future[Verdict | None]] = set()
        while not done:  # short waits: Ctrl-C reaches the main thread between them
            done, _ = wait(list(self._running), timeout=0.5, return_when=FIRST_COMPLETED)
        ended: list[tuple[Job[T], Verdict | None]] = []
        failures: list[BaseException] = []
        for future in [f for f in self._running if f in done]:
            job = self._running.pop(future)
            failure = future.exception()
            if failure is not None:
                failures.append(failure)
            else:
                ended.append((job, future.result()))
        if failures:  # an interrupt first: it ends everything; else the first stop
            raise next((f for f in failures if isinstance(f, KeyboardInterrupt)), failures[0])
        return ended

    def abort(self, interrupted: bool) -> None:
        stop = interrupted
        while True:
            if stop and self.on_interrupt is not None:
                try:
                    self.on_interrupt()
                except Exception:
                    pass  # the threads below still end: their launches clean up after them
            stop = False
            try:
                wait(list(self._running))
                break
            except KeyboardInterrupt:
                stop = True  # another Ctrl-C: stop again, still wait for every thread
        self._running.clear()
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def rounds_bound(n_items: int, workers: int) -> int:
    """ceil(log_{K+1} N) + 2: the rounds a K-worker multisection of N items needs (the two
    ends, then K points a round cutting the open range into K + 1 parts), confirmations
    aside; K = 1 is the binary search's ceil(log2 N) + 2."""
    n = max(n_items, 2)
    rounds = 0
    while (workers + 1) ** rounds < n:  # integer ceil(log_{K+1} N), free of float error
        rounds += 1
    return rounds + 2


def multisect(
    items: Sequence[T],
    probe: Probe[T],
    *,
    workers: int = 2,
    confirm: int = 1,
    runner: Runner[T] | None = None,
) -> BisectResult[T]:
    """`bisect` with `workers` probes at once: each round probes K points that cut the open
    range into K + 1 parts, so about ceil(log_{K+1} N) rounds instead of ceil(log2 N).

    Both ends run in the same round; they must give different verdicts, as for `bisect`. The
    search does not wait for a round's slowest probe: a result narrows the range the moment
    it arrives and the freed worker takes the next point of what is left. A probe the range
    has left behind runs to its end, and its verdict still counts: one that contradicts the
    side it lies on is returned in `contradictions` (the history is not monotone). Skips
    widen the answer; the boundary items are re-probed `confirm` more times, starting as
    soon as a worker has nothing else to do, and any disagreement is flaky, as in `bisect`.
    With one worker it probes exactly what `bisect` does. `runner` replaces the threads."""
    if len(items) < 2:
        raise SearchError("need at least two items to bisect")
    check_count("--workers", workers)
    run: Runner[T] = runner if runner is not None else ThreadRunner(probe, workers)
    search = _Multisection(items, workers, confirm)
    try:
        while True:
            for job in search.next_jobs():
                run.start(job)
            if not search.flight:
                break
            for job, verdict in run.wait():
                search.ended(job, verdict)
    except BaseException as exc:
        run.abort(isinstance(exc, KeyboardInterrupt))
        raise
    if isinstance(run, ThreadRunner):
        run.close()
    return search.result()


class _Multisection(Generic[T]):
    """The state of one multisection: what is known, what runs, what is left to probe."""

    def __init__(self, items: Sequence[T], workers: int, confirm: int) -> None:
        self.items, self.workers, self.confirm = items, workers, confirm
        self.n = len(items)
        self.lo, self.hi = 0, self.n - 1
        self.start: Verdict | None = None
        self.end: Verdict | None = None
        self.first: dict[int, Verdict | None] = {}  # attempt 1, in the order they ended
        self.skipped: set[int] = set()
        self.flight: dict[tuple[int, int], Job[T]] = {}
        self.agreed: dict[int, int] = {}  # index -> the last confirmation attempt that agreed
        self.flaky: list[int] = []
        self.contradictions: list[tuple[int, Verdict, Verdict]] = []
        self.probes: list[tuple[T, int, Verdict | None]] = []

    @property
    def ends_known(self) -> bool:
        return self.start is not None

    def _launch(self, index: int, attempt: int, jobs: list[Job[T]]) -> None:
        job = Job(index, self.items[index], attempt)
        self.flight[(index, attempt)] = job
        jobs.append(job)

    def next_jobs(self) -> list[Job[T]]:
        """What to start now on the free workers: the ends, then points of the open range,
        then confirmations of the current boundary."""
        jobs: list[Job[T]] = []
        for index in (0, self.n - 1):
            free = self.workers - len(self.flight)
            if free > 0 and index not in self.first and (index, 1) not in self.flight:
                self._launch(index, 1, jobs)
        for index in self._points(self.workers - len(self.flight)):
            self._launch(index, 1, jobs)
        if self.ends_known:
            for index in (self.lo, self.hi):
                if self.workers - len(self.flight) <= 0:
                    break
                attempt = self.agreed.get(index, 1) + 1
                confirming = any(key[0] == index and key[1] > 1 for key in self.flight)
                if attempt <= self.confirm + 1 and index not in self.flaky and not confirming:
                    self._launch(index, attempt, jobs)
        return jobs

    def _points(self, free: int) -> list[int]:
        """`free` untried indices that, with the probes already running inside the open
        range, cut it into parts as equal as they can: each part of a segment between
        running probes gets a share of the new points by its length."""
        if free <= 0:
            return []
        lo, hi = self.lo, self.hi
        running = sorted(i for (i, a) in self.flight if a == 1 and lo < i < hi)
        taken = {*running, *self.first, *self.skipped}
        bounds = [lo, *running, hi]
        segments = list(itertools.pairwise(bounds))
        open_in = {s: [i for i in range(s[0] + 1, s[1]) if i not in taken] for s in segments}
        shares = dict.fromkeys(segments, 0)
        for _ in range(free):
            options = [s for s in segments if shares[s] < len(open_in[s])]
            if not options:
                break
            best = max(options, key=lambda s: ((s[1] - s[0]) / (shares[s] + 1), -s[0]))
            shares[best] += 1
        chosen: list[int] = []
        for (a, b), share in shares.items():
            left = list(open_in[(a, b)])
            for part in range(1, share + 1):
                target = a + (b - a) * part / (share + 1)
                pick = min(left, key=lambda i: (abs(i - target), i))
                left.remove(pick)
                chosen.append(pick)
        return chosen

    def ended(self, job: Job[T], verdict: Verdict | None) -> None:
        """Take in one probe's verdict (None: skipped)."""
        del self.flight[(job.index, job.attempt)]
        self.probes.append((job.item, job.attempt, verdict))
        index = job.index
        if job.attempt > 1:
            if verdict is not self.first[index]:
                if index not in self.flaky:
                    self.flaky.append(index)
            else:
                self.agreed[index] = max(self.agreed.get(index, 1), job.attempt)
            return
        self.first[index] = verdict
        if not self.ends_known:
            if 0 in self.first and self.n - 1 in self.first:
                self._check_ends()
                for earlier, found in list(self.first.items()):
                    if earlier not in (0, self.n - 1):
                        self._narrow(earlier, found)
            return
        self._narrow(index, verdict)

    def _check_ends(self) -> None:
        first, last = self.first[0], self.first[self.n - 1]
        if first is None or last is None:
            untestable = self.items[0] if first is None else self.items[-1]
            raise SearchError(f"endpoint {untestable} cannot be tested here")
        if first is last:
            raise SearchError(
                f"both ends ({self.items[0]} and {self.items[-1]}) are {first.value}: "
                "nothing to bisect",
                same_ends=True,
            )
        self.start, self.end = first, last

    def _narrow(self, index: int, verdict: Verdict | None) -> None:
        if verdict is None:
            self.skipped.add(index)
        elif self.lo < index < self.hi:
            if verdict is self.start:
                self.lo = index
            else:
                self.hi = index
        else:  # left behind by the range: it must agree with its side
            expected = self.start if index <= self.lo else self.end
            assert expected is not None
            if verdict is not expected:
                self.contradictions.append((index, verdict, expected))

    def result(self) -> BisectResult[T]:
        assert self.start is not None and self.end is not None
        items, lo, hi = self.items, self.lo, self.hi
        between = [items[i] for i in range(lo + 1, hi)]
        status = "flaky" if self.flaky else ("ambiguous" if between else "found")
        return BisectResult(
            status=status,
            start_verdict=self.start,
            end_verdict=self.end,
            last_start=items[lo],
            first_end=items[hi],
            candidates=[*between, items[hi]],
            probes=self.probes,
            flaky=[items[i] for i in self.flaky],
            contradictions=[(items[i], v, e) for i, v, e in self.contradictions],
        )


def ddmin(changes: Sequence[T], flips: Callable[[list[T]], bool | None]) -> list[T]:
    """Zeller's delta debugging: a 1-minimal subset of `changes` that still flips the verdict.

    `flips(subset)` applies the subset to the last state before the flip and says whether the
    verdict flips (None when that combination cannot be tested: treated as "does not").
    A change that only flips together with another one comes back as the pair.
    """
    current = list(changes)
    granularity = 2
    while len(current) >= 2:
        chunks = _split(current, granularity)
        for chunk in chunks:
            if flips(chunk) is True:
                current, granularity = chunk, 2
                break
        else:
            for chunk in chunks:
                complement = [c for c in current if c not in chunk]
                if len(chunks) > 2 and flips(complement) is True:
                    current, granularity = complement, max(granularity - 1, 2)
                    break
            else:
                if granularity >= len(current):
                    break
                granularity = min(len(current), granularity * 2)
    return current


def _split(items: list[T], parts: int) -> list[list[T]]:
    size, extra = divmod(len(items), parts)
    chunks: list[list[T]] = []
    start = 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        chunks.append(items[start:stop])
        start = stop
    return [c for c in chunks if c]
