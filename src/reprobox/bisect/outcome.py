"""What the driver's search found, as the axes and the summaries read it: one immutable record.

A leaf of `bisect`: the driver and its strategies (`posterior`, `shift`) make an `Outcome`, an
axis's `refine` returns a new one (`dataclasses.replace`) with what only it knows (a date's
package change, a commit's descent into a merge, a sweep's map), and the summary is made from
the last one. Nothing writes into an outcome after it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from reprobox.bisect.changepoint import ShiftAnswer
from reprobox.bisect.flaky import FlakyAnswer
from reprobox.bisect.search import BisectResult
from reprobox.bisect.summary import Contradiction, Details
from reprobox.core.protocol import Verdict

T = TypeVar("T")
Known = tuple[str, Verdict, str]  # (item, verdict, where it was measured)


@dataclass(frozen=True)
class Checked:
    """The answer held against the verdicts on disk: how many there were and whether the
    posterior with them still gives the search's answer at the target."""

    used: int
    holds: bool
    answer: FlakyAnswer[Any]  # the posterior over every observation, disk ones included
    undecided: bool = False  # the search had no answer to hold: they are only counted in

    @property
    def moved(self) -> bool:
        """The verdicts on disk took the search's answer below the target."""
        return not self.holds and not self.undecided


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One search's findings: a plain search's `result` (and `final`, a narrower search
    inside it: a merge), checked by `verified` probes and verdicts on disk (`found`
    contradictions, `agreeing` ones, what was `unread`); or a flake-aware search's posterior
    (`flaky`, `checked` against the disk); or a metric search's `shift`; or a map's
    `verdicts`. `details` and `notes` are what the axis's `refine` adds (None: the
    question's details)."""

    result: BisectResult[T] | None = None
    final: BisectResult[T] | None = None
    found: tuple[Contradiction, ...] = ()
    verified: tuple[str, ...] = ()
    agreeing: int = 0
    unread: str = ""
    on_disk: tuple[Known, ...] = ()  # a map's: the verdicts on disk about its items
    flaky: FlakyAnswer[T] | None = None
    newest_first: bool = False  # the posterior searched from the newest item
    checked: Checked | None = None
    shift: ShiftAnswer[T] | None = None
    verdicts: tuple[tuple[T, Verdict | None], ...] = ()  # a map's, in item order
    details: Details | None = None
    notes: str = ""  # what the axis adds to the assumption (a commit's descent)
