"""What a bisect searches, as the one driver sees it: an axis and a strategy.

An axis (releases of a package, UTC days, first-parent commits) gives its candidates in order,
the probes that turn a candidate into a run (a cell against its lock), and how answers and
errors name them. The strategy says how the driver searches: binary, multisection for K
workers, or the flake-aware posterior. Everything else (the ends, confirmation, verification,
the check against verdicts on disk, the log, the summary) is the driver's (`bisect.driver`),
written once for every axis. The bisect in progress (`Run`, with a flaky answer's `Checked`)
is declared here beside the axis whose hooks read it, so the driver and its strategies
(`bisect.posterior`, `bisect.shift`) import it from below and never from each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from reprobox.bisect import checks
from reprobox.bisect.changepoint import ShiftAnswer
from reprobox.bisect.flaky import FlakyAnswer
from reprobox.bisect.log import ProbeLog
from reprobox.bisect.prober import Prober, Probes, Target
from reprobox.bisect.search import BisectResult, SearchError
from reprobox.bisect.summary import BisectSummary, Contradiction, Kind
from reprobox.core.counts import check_count
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.core.spec import Repro

T = TypeVar("T")

# the posterior an answer needs: at 0.99, 0.5 - 1.5% of the simulated bisects in
# docs/noise.md named a wrong release; at 0.999, 0 of 200 (about 30% more runs)
DEFAULT_CONFIDENCE = 0.999
DEFAULT_MAX_RUNS = 300
# a metric search (`bisect.changepoint`): launches, not verdicts; a 0.5 sd shift over 8
# releases takes about 400 (docs/noise.md), so 300 would leave it undecided
DEFAULT_METRIC_RUNS = 2000
DEFAULT_MIN_SHIFT = 0.25  # sd: the smallest shift of a metric's mean that is a change


@dataclass(frozen=True)
class Strategy:
    """How the driver searches. `flaky`: the posterior search (`bisect.flaky`), stopping at
    `confidence` or after `max_runs` launches; `mapping`: no search, every item probed once
    (a sweep); else binary (`workers` 1) or a multisection (`workers` K), each boundary
    probe repeated `confirm` times, `verify` probes per side."""

    confirm: int = 1
    verify: int | None = None
    workers: int = 1
    flaky: bool = False
    confidence: float = DEFAULT_CONFIDENCE
    max_runs: int = DEFAULT_MAX_RUNS
    mapping: bool = False
    # a flaky bisect of a variant judged by a metric test: the metric its samples are read
    # for (`bisect.changepoint`), and the smallest shift of its mean that counts, in sd
    metric: str | None = None
    min_shift: float = DEFAULT_MIN_SHIFT

    def check(self) -> Strategy:
        """The strategy, or BadInput naming the first flag out of its range."""
        check_count("--confirm", self.confirm, least=0)
        if self.verify is not None:
            check_count("--verify", self.verify, least=0)
        check_count("--workers", self.workers)
        check_count("--max-runs", self.max_runs)
        if not 0.5 < self.confidence < 1:
            raise BadInput(f"--confidence {self.confidence}: want a number above 0.5 and below 1")
        if not 0 < self.min_shift < 100:
            raise BadInput(f"--min-shift {self.min_shift}: want a positive number of sd, below 100")
        return self


def declared_metric(repro: Repro, variant: str) -> str | None:
    """The metric a noisy variant's declared test reads (t, sign), or None (pass/fail): a
    flaky bisect of it searches the metric's samples, as the test does."""
    section = repro.verdict(variant)
    if section.repeats is None or section.test == "sprt":
        return None
    return section.metric


def declares_noise(repro: Repro, variant: str) -> bool:
    """Whether the variant's outcome is declared noisy (`[verdict] repeats`): its bisects
    are flake-aware unless told otherwise."""
    return repro.noisy(variant)


@dataclass
class Axis(Generic[T]):
    """One bisect's candidates (oldest first), how a candidate becomes a probe, and how it is
    named. `good`/`bad` are the ends the user named (None: the first and last candidates,
    either way round: a date range has no good or bad end). The hooks let an axis add what
    only it knows: `refine` runs after the search while probes can still run (a date's
    delta debugging, a commit's descent into a merge), `notes` adds to the assumption,
    `answer` writes the closing line (default: `summary.answer`; it may fill in what the
    line names, a commit's details), `summarize` makes a map's summary (a sweep)."""

    kind: Kind
    noun: str  # in the assumption: "release", "day", "commit"
    items: Sequence[T]
    header: dict[str, Any]  # the probe log's first line: other arguments, another bisect
    fields: dict[str, Any]  # the summary's question (kind, package, floated, versions, ...)
    probes_for: Callable[[Path], Probes[T]]  # the probes, given the folder their runs go in
    describe: Callable[[T], str] = str
    good: T | None = None
    bad: T | None = None
    flags: tuple[str, str] = ("--good", "--bad")
    shown: Callable[[T], str] | None = None  # an end as errors name it (default: describe)
    key: Callable[[str], object] = str  # names compared with names on disk ("1.25" = "1.25.0")
    subject: str = ""  # what prefixes item names in answers ("trl ")
    word: str = ""  # the noun of the answer line ("release", "date"); default: noun
    suggest: str = ""  # what an uncertain answer suggests
    sweep: str = ""  # the command that probes every item, when there is one
    ends_advice: str = ""  # what ends alike suggest without a sweep
    yanked: list[str] = field(default_factory=list)
    advice: Callable[[SearchError], str] | None = None
    ends: tuple[str, str] = ("", "")  # the range's ends as the assumption names them
    refine: Callable[[Run[T]], None] | None = None
    notes: Callable[[Run[T]], str] | None = None
    answer: Callable[[BisectSummary, Run[T]], str] | None = None
    summarize: Callable[[Run[T]], BisectSummary] | None = None

    def __post_init__(self) -> None:
        if not self.items:
            raise BadInput(f"no {self.noun} to probe")
        if not any(self.ends):
            self.ends = (self.describe(self.items[0]), self.describe(self.items[-1]))
        self.word = self.word or self.noun

    @property
    def names(self) -> list[str]:
        return [self.describe(item) for item in self.items]

    def name_of(self, item: T) -> str:
        return (self.shown or self.describe)(item)

    def tags(self, item: T) -> list[str]:
        return ["yanked"] if self.describe(item) in self.yanked else []


@dataclass
class Run(Generic[T]):
    """One bisect in progress: what the search found and what checked it. Axis hooks read
    it (and `refine` may narrow it: `final`, `more` for the summary)."""

    axis: Axis[T]
    target: Target
    prober: Prober[T]
    log: ProbeLog
    strategy: Strategy
    question: BisectSummary
    result: BisectResult[T] | None = None
    final: BisectResult[T] | None = None  # a narrower search inside `result` (a merge)
    found: list[Contradiction] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    agreeing: int = 0
    unread: str = ""
    more: dict[str, Any] = field(default_factory=dict)  # fields the axis adds to the summary
    flaky: FlakyAnswer[T] | None = None
    shift: ShiftAnswer[T] | None = None
    checked: Checked | None = None
    verdicts: list[tuple[T, Verdict | None]] = field(default_factory=list)  # a map's

    def on_disk(self) -> tuple[list[checks.Known], str]:
        """Verdicts on disk about this range, beyond this session's probes."""
        ours = {p.key for p in self.prober.runs}
        return checks.verdicts_on_disk(self.target, self.question, self.log, ours)


@dataclass
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
