"""What a bisect writes and what its readers read: probe entries and the summary, typed.

The probe log (one `ProbeEntry` per line), the closing `summary.json` (a `BisectSummary`), the
terminal and the report all go through these models, so a field is named and checked once.
Readers are lenient about what older files lack (defaults) and strict about what is wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    computed_field,
    model_validator,
)

from reprobox.bisect.search import BisectResult
from reprobox.core.protocol import Verdict

SUMMARY_FILE = "summary.json"
LOG_FILE = "probes.jsonl"

Status = Literal["found", "ambiguous", "flaky", "non-monotone", "mapped", "no-change", "undecided"]
Kind = Literal["release", "date", "sweep", "commit", "attribution"]


class ProbeEntry(BaseModel):
    """One measured probe: a verdict, or a skip with its reason (never both, never neither)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: str = Field(min_length=1)  # "<item>#<attempt>": what the log is looked up by
    item: str
    attempt: int = Field(default=1, ge=1)
    verdict: Literal["clean", "reproduced"] | None = None
    value: float | None = None  # a metric search's probe: the launch's value of the metric
    skip: bool = False
    reason: str = ""
    record: str | None = None  # the probe's run folder
    wall_s: float = 0.0
    lock_hash: str | None = None  # the environment key: same key, same environment, same run
    same_as: str | None = None  # the item whose run this one reused
    tags: list[str] = []  # e.g. "yanked"
    resumed: bool = False  # read from the log of an earlier, interrupted run (never written)
    # "about N steps left" after this probe (`bisect.plan.StepsLeft`; never written)
    steps_left: int | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _key_from_item(cls, data: Any) -> Any:
        # Summaries written by hand (or by older versions) may leave the key out.
        if isinstance(data, dict) and "key" not in data and "item" in data:
            return {**data, "key": f"{data['item']}#{data.get('attempt', 1)}"}
        return data

    @model_validator(mode="after")
    def _verdict_or_skip(self) -> ProbeEntry:
        if self.skip == (self.verdict is not None):
            raise ValueError("a probe has either a verdict or skip = true")
        return self

    @property
    def outcome(self) -> Verdict | None:
        """The verdict, or None for a skip (what the search reads)."""
        return Verdict(self.verdict) if self.verdict else None

    @property
    def fresh(self) -> bool:
        """Launched in this session (not read from the log, not another item's run)."""
        return not (self.resumed or self.same_as)

    def log_line(self) -> str:
        return self.model_dump_json(exclude={"resumed"}, exclude_defaults=True)


class Contradiction(BaseModel):
    """A measured verdict that the answer, assuming one change, says cannot be."""

    item: str
    verdict: Verdict
    expected: Verdict
    source: str  # "verify probe", "this log", "record <dir>", "bisect <id>"


class Event(BaseModel):
    """An advisory-style event over releases (OSV's introduced / fixed / last_affected).

    An event is a fact only between two adjacent probed releases. `bound` marks one that is
    not: the change is at or before the release named (the range's first release, or after
    untested ones; `after` is the last probed release before it, None at the range's start),
    and `last_affected` is the range's last release still reproducing (no fix seen)."""

    introduced: str | None = None
    fixed: str | None = None
    last_affected: str | None = None
    bound: bool = False
    after: str | None = None


class CommitAnswer(BaseModel):
    """The commit a commit bisect names, as a maintainer looks it up."""

    sha: str
    subject: str = ""
    author: str = ""
    email: str = ""
    date: str = ""
    pr: int | None = None  # from `(#N)` in a squash subject or `Merge pull request #N`
    link: str | None = None  # the commit on the forge, when it is GitHub
    pr_link: str | None = None
    merge: str | None = None  # the merge commit it came in with (after a descent)


class ReleaseDetails(BaseModel):
    """A release bisect's question: the package and the ends as the user named them."""

    kind: Literal["release"] = "release"
    package: str | None = None
    good: str | None = None
    bad: str | None = None


class SweepDetails(BaseModel):
    """A sweep's question and map: the package, the range, the affected releases as
    advisory ranges and events, and the releases it could not test."""

    kind: Literal["sweep"] = "sweep"
    package: str | None = None
    range: str | None = None
    affected: str = ""  # "" when nothing reproduces
    events: list[Event] = []
    untested: list[str] = []


class DateDetails(BaseModel):
    """A date bisect's question (UTC days, floated packages) and what its answer day holds:
    the releases uploaded on it, the packages that changed, the ones that flip it."""

    kind: Literal["date"] = "date"
    start: str | None = None
    end: str | None = None
    floated: list[str] = []
    released_on_day: list[str] = []  # "trl 0.7.2 at 2023-10-12 13:09 UTC"
    changes: list[str] = []
    culprit: list[str] = []


class CommitDetails(BaseModel):
    """A commit bisect's question (the repository, the refs and their shas; the summary's
    `versions` hold the first-parent shas, oldest first) and the commit it names."""

    kind: Literal["commit"] = "commit"
    package: str | None = None
    repo: str | None = None
    good: str | None = None
    bad: str | None = None
    good_sha: str | None = None
    bad_sha: str | None = None
    first_parent: bool = True
    descended: list[str] = []  # the merges whose second parent was searched
    commit: CommitAnswer | None = None  # the answer's commit, when one was found


class AttributionDetails(BaseModel):
    """An attribution's question (the two environments as the user named them, what differs
    between them) and its answer: the change(s) that flip the verdict and, for one package,
    its releases at the ends (the release itself is the summary's `first`)."""

    kind: Literal["attribution"] = "attribution"
    start: str | None = None
    end: str | None = None
    changes: list[str] = []
    culprit: list[str] = []
    package: str | None = None
    good: str | None = None
    bad: str | None = None
    # packages that moved with the culprit's change, at the version they held on both
    # sides of its release (the split of a pair that installs only together)
    held: dict[str, str] = {}
    split_tries: list[str] = []  # what each try to tell such a pair apart found


Details = Annotated[
    ReleaseDetails | SweepDetails | DateDetails | CommitDetails | AttributionDetails,
    Field(discriminator="kind"),
]
# the fields a summary of before the tagged `details` kept flat, by the kind that owns them
_FLAT = {
    kind: [name for name in model.model_fields if name != "kind"]
    for kind, model in (
        ("release", ReleaseDetails), ("sweep", SweepDetails),
        ("date", DateDetails), ("commit", CommitDetails), ("attribution", AttributionDetails),
    )
}  # fmt: skip
_ALL_FLAT = {name for names in _FLAT.values() for name in names}


class BisectSummary(BaseModel):
    """The closing document of a bisect or a sweep, beside its probe log: the fields every
    kind has, and its kind's own in `details` (tagged by `kind`)."""

    model_config = ConfigDict(extra="ignore")

    details: Details = ReleaseDetails()
    repro: str = ""
    variant: str = ""
    platform: str = "cpu"
    # the other packages every probe ran at (`--with`), each source fixed to one commit
    overrides: dict[str, str] = {}
    override_commits: dict[str, str] = {}
    # the candidates as named (releases, days, first-parent shas), oldest first
    versions: list[str] = []
    yanked: list[str] = []
    # the answer
    status: Status = "found"
    result: str = ""  # the one line a bisect ends with
    assumption: str = ""
    start_verdict: str | None = None
    end_verdict: str | None = None
    last_start: str | None = None
    first: str | None = None
    candidates: list[str] = []
    flaky: list[str] = []
    verified: list[str] = []  # the extra probes --verify ran
    agreeing: int = 0  # verdicts already on disk that agree with the answer
    contradictions: list[Contradiction] = []
    # a flake-aware bisect (`strategy` "flaky"): the posterior after `runs` probes
    strategy: str = "binary"
    confidence: float | None = None  # the posterior of the answer (undecided: of the leader)
    target_confidence: float | None = None
    no_change: float | None = None  # the posterior of "no change in the range"
    posterior: dict[str, float] = {}  # each candidate: that it is the first of the end side
    outcomes: dict[str, list[int]] = {}  # each probed candidate: [reproduced, runs]
    # a metric search (`strategy` "shift"): the metric, each probed candidate's samples as
    # [n, mean, sd], the smallest shift that counts and the shift found, in sd
    metric: str | None = None
    levels: dict[str, list[float | None]] = {}
    min_shift: float | None = None
    shift: float | None = None
    # the probes and their cost
    probes: list[ProbeEntry] = []
    distinct_probed: int = 0
    runs: int = 0
    launched: int = 0
    skips: int = 0
    bound: int = 0
    items: int = 0
    wall_s: float = 0.0
    probe_wall_s: float = 0.0
    # set by readers and writers, not stored
    id: str = Field(default="", exclude=True)
    summary_path: str = Field(default="", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _details_from_flat(cls, data: Any) -> Any:
        # A summary written before `details` (or by hand) keeps its kind's fields flat.
        if not isinstance(data, dict) or "details" in data:
            return data
        kind = data.get("kind", "release")
        flat = {k: v for k, v in data.items() if k not in _ALL_FLAT and k != "kind"}
        if kind not in _FLAT:
            return {**flat, "details": {"kind": kind}}  # the union names what is wrong
        own = {k: data[k] for k in _FLAT[kind] if k in data}
        return {**flat, "details": {"kind": kind, **own}}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def kind(self) -> Kind:
        """release, date, commit or sweep: the tag of `details`."""
        return self.details.kind

    @property
    def package(self) -> str | None:
        """The package whose releases or commits were searched (None: a date bisect)."""
        return None if isinstance(self.details, DateDetails) else self.details.package

    def contradicted_by(
        self, known: Iterable[tuple[str, Verdict, str]]
    ) -> tuple[list[Contradiction], int]:
        """(item, verdict, source) measured elsewhere against this answer: those
        that contradict it, and how many agree. Releases outside `versions`, or between the
        two sides (skipped candidates), say nothing."""
        if self.kind == "sweep" or self.first is None or self.last_start is None:
            return [], 0
        key = _version if self.kind == "release" else _same  # shas and days as they are
        positions = {key(v): i for i, v in enumerate(self.versions)}
        lo, hi = positions.get(key(self.last_start)), positions.get(key(self.first))
        if lo is None or hi is None:
            return [], 0
        against: list[Contradiction] = []
        agreeing = 0
        for item, verdict, source in known:
            index = positions.get(key(item))
            if index is None or lo < index < hi:
                continue
            side = self.start_verdict if index <= lo else self.end_verdict
            if side is None or verdict not in (Verdict.CLEAN, Verdict.REPRODUCED):
                continue
            wanted = Verdict(side)
            if verdict is wanted:
                agreeing += 1
            else:
                against.append(
                    Contradiction(item=item, verdict=verdict, expected=wanted, source=source)
                )
        return against, agreeing

    def counts(self, probes: list[ProbeEntry], n_items: int, wall_s: float) -> BisectSummary:
        """The same summary with the probe tallies filled in from `probes`."""
        fresh = [p for p in probes if p.fresh]
        return self.model_copy(
            update={
                "probes": probes,
                "distinct_probed": len({p.item for p in probes}),
                "runs": len(probes),
                "launched": len(fresh),
                "skips": sum(1 for p in probes if p.skip),
                "bound": math.ceil(math.log2(max(n_items, 2))) + 2,
                "items": n_items,
                "wall_s": round(wall_s, 3),
                "probe_wall_s": round(sum(p.wall_s for p in fresh), 3),
            }
        )


def from_search(
    question: BisectSummary,
    result: BisectResult[Any],
    found: list[Contradiction],
    verified: list[str],
    *,
    shown: Callable[[Any], str] = str,
    final: BisectResult[Any] | None = None,
    agreeing: int = 0,
    details: Details | None = None,
) -> BisectSummary:
    """A bisect's summary from its search, on its `question`. Any contradiction (a verify
    probe or a verdict on disk against the answer) makes the status non-monotone, never
    found: the one place that rule lives. `final` is a narrower search inside `result` (a
    descent into a merge); `details` what the axis found beside it (None: the question's)."""
    last = final or result
    status = "non-monotone" if found and result.status != "flaky" else last.status
    return question.model_copy(
        update={
            "status": status,
            "start_verdict": result.start_verdict.value,
            "end_verdict": result.end_verdict.value,
            "last_start": shown(result.last_start),
            "first": shown(last.first_end),
            "candidates": [shown(c) for c in last.candidates],
            "flaky": [shown(f) for f in [*result.flaky, *(final.flaky if final else [])]],
            "verified": verified,
            "contradictions": list(found),
            "agreeing": agreeing,
            "details": details if details is not None else question.details,
        }
    )


def summary_file(log_path: Path) -> Path:
    """Where a log's summary goes: `summary.json` beside a default log (one folder per
    bisect), `X.summary.json` beside any other `X.jsonl`, so two logs never share one."""
    if log_path.name == LOG_FILE:
        return log_path.with_name(SUMMARY_FILE)
    return log_path.with_name(f"{log_path.stem}.{SUMMARY_FILE}")


def runs_dir(log_path: Path) -> Path:
    """Where a log's probes run: `runs/` beside a default log, `X.runs/` beside `X.jsonl`."""
    if log_path.name == LOG_FILE:
        return log_path.with_name("runs")
    return log_path.with_name(f"{log_path.stem}.runs")


def write_summary(log_path: Path, summary: BisectSummary) -> BisectSummary:
    """The log's summary (`summary_file`), written whole (tmp then rename)."""
    path = summary_file(log_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(summary.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return summary.model_copy(update={"summary_path": str(path)})


def read_summary(path: Path) -> BisectSummary:
    """One summary file; ValueError (with the file named) when it is not one."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        summary = BisectSummary.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: not a bisect summary ({first_problem(exc)})") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    return summary.model_copy(update={"id": path.parent.name, "summary_path": str(path)})


def read_summaries(bisect_dir: Path) -> tuple[list[BisectSummary], list[str]]:
    """Every `<bisect_dir>/*/summary.json`, newest first, and a line per unreadable one."""
    found: list[BisectSummary] = []
    skipped: list[str] = []
    paths = [p for p in bisect_dir.glob(f"*/{SUMMARY_FILE}") if p.is_file()]
    for path in sorted(paths, key=_mtime, reverse=True):
        try:
            found.append(read_summary(path))
        except ValueError as exc:
            skipped.append(str(exc))
    return found, skipped


def first_problem(exc: ValidationError) -> str:
    """pydantic's first complaint, in one line: `field: message`."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _same(text: str) -> str | None:
    return text


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
