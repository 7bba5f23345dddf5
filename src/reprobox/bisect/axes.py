"""What a bisect searches, as the one driver sees it: an `Axis`, asked by a `Question`.

An axis (releases of a package, UTC days, first-parent commits, a sweep's releases) is a class
in its own module (`releases`, `dates`, `commits`, `sweep`) with four methods: `probes` (how a
candidate becomes a run: the cell against its lock), `name` (a candidate as logs, summaries
and answers name it), `refine` (what only it knows, after the search, while probes can still
run: a date's delta debugging, a commit's descent into a merge, a sweep's map) and `answer`
(the closing line). Its `question` is plain data: the candidates in order, the ends, the probe
log's header, the summary's question (its kind's `details`) and the words the driver's
messages use. The driver (`bisect.driver`) does everything else once for every axis and hands
the axis an immutable `outcome.Outcome`; `Context` is the bisect in progress that the driver
and its strategies (`bisect.posterior`, `bisect.shift`) share, declared here so they import it
from below and never from each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from reprobox.bisect import checks
from reprobox.bisect.answer_line import answer
from reprobox.bisect.outcome import Known, Outcome
from reprobox.bisect.probe_log import ProbeLog
from reprobox.bisect.prober import Prober, Probes, Target
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import BisectSummary
from reprobox.core.errors import BadInput

T = TypeVar("T")


@dataclass(frozen=True)
class Question(Generic[T]):
    """One bisect's candidates (oldest first) and how the driver speaks of them. `good`/
    `bad` are the ends the user named (None: the first and last candidates, either way
    round: a date range has no good or bad end); `asked` is the summary's question (the
    common fields and the kind's `details`); `header` the probe log's first line."""

    noun: str  # in the assumption: "release", "day", "commit"
    candidates: Sequence[T]
    header: Mapping[str, Any]  # the probe log's first line: other arguments, another bisect
    asked: BisectSummary
    names: tuple[str, ...]  # each candidate as `Axis.name` names it
    good: T | None = None
    bad: T | None = None
    flags: tuple[str, str] = ("--good", "--bad")
    ends_shown: Mapping[str, str] | None = None  # an end as errors name it (default: its name)
    key: Callable[[str], object] = str  # names compared with names on disk ("1.25" = "1.25.0")
    subject: str = ""  # what prefixes item names in answers ("trl ")
    word: str = ""  # the noun of the answer line ("release", "date"); default: noun
    suggest: str = ""  # what an uncertain answer suggests
    sweep: str = ""  # the command that probes every item, when there is one
    ends_advice: str = ""  # what ends alike suggest without a sweep
    came_and_went: str = ""  # what a search whose ends agree suggests
    ends: tuple[str, str] = ("", "")  # the range's ends as the assumption names them
    note: str = ""  # what every assumption adds (the overrides each probe pinned)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise BadInput(f"no {self.noun} to probe")
        if not any(self.ends):
            object.__setattr__(self, "ends", (self.names[0], self.names[-1]))
        object.__setattr__(self, "word", self.word or self.noun)

    def shown(self, name: str) -> str:
        """An end as errors name it (a commit: its ref and short sha)."""
        return (self.ends_shown or {}).get(name, name)

    def tags(self, name: str) -> list[str]:
        return ["yanked"] if name in self.asked.yanked else []


class Axis(Protocol[T]):
    """What one kind of bisect adds to the driver; see the module docstring."""

    @property
    def question(self) -> Question[T]: ...

    def name(self, item: T) -> str:
        """A candidate as the log, the summary and the answer name it."""
        ...

    def probes(self, runs: Path) -> Probes[T]:
        """How each candidate runs (its cell against its lock), given the runs' folder."""
        ...

    def refine(self, outcome: Outcome[T], prober: Prober[T], strategy: Strategy) -> Outcome[T]:
        """The outcome with what only this axis knows (after a plain search or a map)."""
        ...

    def answer(self, summary: BisectSummary, outcome: Outcome[T]) -> str:
        """The one line a plain search or a map ends with."""
        ...


def plain_answer(question: Question[Any], summary: BisectSummary, detail: str = "") -> str:
    """The closing line of a plain search as most axes say it (`answer_line.answer`)."""
    return answer(
        summary, question.word, question.subject, question.ends, detail=detail,
        suggest=question.suggest,
    )  # fmt: skip


@dataclass(frozen=True)
class Context(Generic[T]):
    """One bisect in progress, as the driver and its strategies share it (read only)."""

    axis: Axis[T]
    target: Target
    prober: Prober[T]
    log: ProbeLog
    strategy: Strategy

    @property
    def question(self) -> Question[T]:
        return self.axis.question

    def on_disk(self) -> tuple[list[Known], str]:
        """Verdicts on disk about this range, beyond this session's probes."""
        ours = {p.key for p in self.prober.runs}
        return checks.verdicts_on_disk(self.target, self.question.asked, self.log, ours)
