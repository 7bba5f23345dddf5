"""Progress while cells and probes run, so a run never goes silent.

At a terminal a live line names the cell and its phase (resolving, installing N packages,
launching, running, judging) with the time elapsed. In CI or off a terminal, each phase is
one plain line, and while a phase lasts a heartbeat line (`still installing ... 50 s`) comes
after `Settings.heartbeat_s` seconds without output (REPROBOX_HEARTBEAT_S, default 25), so a
log is never silent for 30 s. The phases come from the pipeline (run/phases.py); this module
only says them.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from reprobox.cli import ui
from reprobox.core.cells import Cell
from reprobox.core.records import Record
from reprobox.run.phases import Phase

if TYPE_CHECKING:
    from reprobox.bisect.summary import ProbeEntry

_TALLY_ORDER = ("clean", "reproduced", "cannot_test", "error")


class Heartbeat:
    """A "still ..." line after `interval` seconds with no line, while a phase lasts."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._what: str | None = None
        self._since = self._spoke = time.monotonic()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def phase(self, what: str | None) -> None:
        """A phase began (`what`: `nap first: running`), or none is under way (None)."""
        with self._lock:
            self._what, self._since = what, time.monotonic()

    def spoke(self) -> None:
        """A line was printed: the silence starts again."""
        with self._lock:
            self._spoke = time.monotonic()

    def _beat(self) -> None:
        tick = min(1.0, self.interval / 4)
        while not self._stop.wait(tick):
            with self._lock:
                now = time.monotonic()
                if self._what is None or now - self._spoke < self.interval:
                    continue
                head, _, phase = self._what.partition(": ")
                line = f"{head}: still {phase} ... {now - self._since:.0f} s"
                self._spoke = now
            ui.info(line)


class CellProgress:
    """Progress over the cells of one invocation: a live line in a terminal, lines elsewhere."""

    def __init__(self, repro: str, total: int) -> None:
        self.repro, self.total, self.index = repro, total, 0
        self.counts: dict[str, int] = {}
        self.started = time.monotonic()
        self._progress: Progress | None = None
        self._heartbeat: Heartbeat | None = None
        self._task: Any = None
        self._where: dict[tuple[str, ...], str] = {}  # cells -> "[2/4] repro labels"
        self._lock = threading.RLock()  # phases come from launch threads too

    def __enter__(self) -> CellProgress:
        if ui.interactive():
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),  # labels hold [brackets]
                TimeElapsedColumn(),
                console=ui.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.repro, total=self.total)
        else:
            self._heartbeat = Heartbeat(ui.heartbeat_s())
            self._heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def start(self, cells: list[Cell]) -> None:
        with self._lock:
            first, self.index = self.index + 1, self.index + len(cells)
            where = f"{first}" if len(cells) == 1 else f"{first}-{self.index}"
            labels = ", ".join(cell.label for cell in cells)
            shared = " (one launch)" if len(cells) > 1 else ""
            tally = self.tally()
            done = f"  (done: {tally})" if tally else ""
            head = f"[{where}/{self.total}] {self.repro} {labels}{shared}"
            self._where[tuple(cell.label for cell in cells)] = head
            self._say(head + " ..." + done, None)

    def phase(self, phase: Phase) -> None:
        """A phase began: the live line names it; off a terminal, one line (and heartbeats)."""
        with self._lock:
            labels = ", ".join(phase.cells)
            head = self._where.get(phase.cells, f"{self.repro} {labels}")
            self._say(f"{head}: {phase.text()}", f"{self.repro} {labels}: {phase.text()}")

    def done(self, record: Record) -> None:
        with self._lock:
            verdict = record.verdict or "error"
            self.counts[verdict] = self.counts.get(verdict, 0) + 1
            if self._progress is not None:
                self._progress.advance(self._task)
                self._progress.console.print()  # keep the finished line above the live bar
            ui.record_line(record)
            if self._heartbeat is not None:
                self._heartbeat.spoke()
                self._heartbeat.phase(None)

    def _say(self, text: str, beat: str | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)
            return
        ui.info(text)
        if self._heartbeat is not None:
            self._heartbeat.spoke()
            self._heartbeat.phase(beat)

    def tally(self) -> str:
        """What has finished so far, `1 clean, 1 reproduced`, kept apart from the running
        cell so a count is never read as part of its label."""
        order = {verdict: index for index, verdict in enumerate(_TALLY_ORDER)}
        ranked = sorted(self.counts.items(), key=lambda item: (order.get(item[0], 99), item[0]))
        return ", ".join(f"{n} {verdict}" for verdict, n in ranked)


class BisectProgress:
    """One line per probe; in a terminal, a live status line while probes run."""

    def __init__(self, repro: str, verb: str = "bisecting") -> None:
        self.repro, self.verb, self.count = repro, verb, 0
        self._status: Any = None

    def __enter__(self) -> BisectProgress:
        if ui.interactive():
            first = "confirming both ends" if self.verb == "bisecting" else "first probe"
            self._status = ui.console.status(Text(f"{self.verb} {self.repro}: {first}"))
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()

    def probe(self, entry: ProbeEntry) -> None:
        self.count += 1
        verdict = entry.verdict or "skipped"
        again = f" (repeat {entry.attempt})" if entry.attempt > 1 else ""
        tags = "".join(f" ({tag})" for tag in entry.tags)
        if entry.resumed:
            source = "from the log"
        elif entry.same_as:
            source = f"same environment as {entry.same_as}"
        else:
            source = f"{entry.wall_s:.1f}s"
        reason = f" - {entry.reason}" if entry.skip else ""
        steps = entry.steps_left
        left = f"; about {steps} step{'s' * (steps != 1)} left" if steps else ""
        line = f"probe {self.count}: {entry.item}{tags}{again}: {verdict} ({source}){reason}"
        ui.info(line + left)
        if self._status is not None:
            self._status.update(Text(f"{self.verb} {self.repro}: {self.count} probes so far{left}"))
