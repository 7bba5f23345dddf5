"""The corpus campaign: every corpus repro (one with a `[truth]`) is asked the questions its
truth answers, through the CLI as a user would ask them, and each answer is held against
that truth: right, an honest refusal, or wrong.

Pure apart from the injected `Ask` (a CLI call: arguments in, exit code and JSON out): the
questions come from the spec, the grading from the documented JSON (docs/json.md), so the
grading is tested with canned answers and the campaign with real ones (`nox -s corpus`).
A wrong answer is one printed as certain that the truth contradicts: a verdict that misses
its variant's expectation, a boundary at another release, "no change" over a range that
holds an edge, a sweep whose ranges are not the truth's. Anything that claims nothing (an
undecided, flaky or non-monotone bisect, an error, cannot-test) is a refusal.

A case whose culprit is another package than the one it was reported in (`[truth]
reported_in`) is also asked the attribution: `reprobox attribute` from the committed lock of
a variant pinning the culprit at its last good release to that of one pinning it at its first
bad (two environments that differ in several pins), graded right when it names the package
at its first bad release.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Literal, get_args

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from reprobox.core.spec import Repro, TruthSection
from reprobox.run.installs import lock_path

WAKE_S = 0.2  # how soon the campaign's main thread handles a signal
QuestionKind = Literal["verdicts", "bisect", "sweep", "attribution"]
KINDS: tuple[QuestionKind, ...] = get_args(QuestionKind)  # in the order a case asks them
Grade = Literal["right", "refused", "wrong"]


@dataclass(frozen=True)
class Question:
    case: str
    kind: QuestionKind
    args: tuple[str, ...]  # the `reprobox` arguments, `--json` included
    truth: TruthSection
    unasked: str = ""  # why it cannot be asked (a refusal without a run)
    # which edge a bisect is asked for: where the bug came, or (a bug born with its feature,
    # no last good release) where it went
    edge: Literal["breaking", "fixing"] = "breaking"
    # what a sweep covers: the whole range, or (a noisy case) one edge's two releases
    span: Literal["range", "breaking", "fixing"] = "range"

    @property
    def label(self) -> str:
        """The question as the table names it."""
        return self.kind if self.span == "range" else f"{self.kind} ({self.span} edge)"


@dataclass(frozen=True)
class Reply:
    """What one CLI call gave: its exit code, its JSON (None when it printed none), and what
    it cost (the CPU of the whole process tree, the wall time)."""

    code: int
    data: Any
    cpu_s: float
    wall_s: float
    error: str = ""  # the last line of stderr, for an answer that is no answer


@dataclass(frozen=True)
class Answer:
    question: Question
    grade: Grade
    line: str  # the answer as the CLI put it (the bisect's result line, the verdicts)
    why: str  # what the grade rests on
    runs: int
    cpu_s: float
    wall_s: float


Ask = Callable[[Sequence[str]], Reply]


def questions(repro: Repro, kinds: Collection[str] = KINDS) -> list[Question]:
    """What the repro's truth answers, of the `kinds` asked: its default verdicts, a release
    bisect over a range holding the breaking edge (the `[bisect]` range when it is over the
    truth's package, else last good .. first bad), a sweep over both edges and, where the
    culprit is another package, the attribution. A bug born with its feature (no last good
    release) is asked the fixing edge instead (first fixed .. first bad)."""
    return [q for q in _questions(repro) if q.kind in kinds]


def _questions(repro: Repro) -> list[Question]:
    truth = repro.spec.truth
    if truth is None:
        return []
    name = repro.name
    section = repro.spec.bisect
    variant = _broken(repro)
    if section is not None and section.package == truth.package:
        variant = section.variant
    searched = ("--package", truth.package, "--variant", variant)
    upper = truth.first_fixed or truth.first_bad
    verdicts = Question(name, "verdicts", ("run", name, "--resume", "--json"), truth)
    if truth.last_good is None:
        sweep = ("sweep", name, *searched, "--range", f">={truth.first_bad},<={upper}", "--json")
        if truth.first_fixed is None:
            why = "born with its feature and never fixed: no edge a release bisect can find"
            bisect = Question(name, "bisect", (), truth, unasked=why)
        else:
            fixing = ("--good", truth.first_fixed, "--bad", truth.first_bad)
            bisect = Question(name, "bisect", ("bisect", name, *searched, *fixing, "--json"),
                              truth, edge="fixing")  # fmt: skip
        return [verdicts, bisect, Question(name, "sweep", sweep, truth)]
    good, bad = truth.last_good, truth.first_bad
    if section is not None and section.package == truth.package:
        if section.good and section.bad and _holds_edge(section.good, section.bad, truth):
            good, bad = section.good, section.bad
    return [
        verdicts,
        Question(name, "bisect", ("bisect", name, *searched, "--good", good, "--bad", bad,
                                  "--json"), truth),
        *_sweeps(repro, variant, searched, good, upper),
        *([_attribution(repro, variant, truth)] if truth.reported_in else []),
    ]  # fmt: skip


def _sweeps(
    repro: Repro, variant: str, searched: tuple[str, ...], good: str, upper: str
) -> list[Question]:
    """A sweep of every release from `good` to `upper`; for a noisy variant (tens of
    launches a release) with a `last_bad` in its truth, a sweep of each edge's two releases
    instead: what the truth claims, at a cost that does not grow with the range."""
    truth, name = repro.spec.truth, repro.name
    assert truth is not None
    if not (repro.noisy(variant) and truth.last_bad and truth.first_fixed):
        span = f">={good},<={upper}"
        return [Question(name, "sweep", ("sweep", name, *searched, "--range", span, "--json"),
                         truth)]  # fmt: skip
    ends: list[tuple[Literal["breaking", "fixing"], str, str]] = [
        ("breaking", good, truth.first_bad),
        ("fixing", truth.last_bad, truth.first_fixed),
    ]
    return [
        Question(name, "sweep", (
            "sweep", name, *searched, "--range", f">={low},<={high}", "--json"
        ), truth, span=edge)
        for edge, low, high in ends
    ]  # fmt: skip


def _attribution(repro: Repro, variant: str, truth: TruthSection) -> Question:
    """`attribute` from the lock of a variant pinning the culprit at its last good release
    to the lock of one pinning it at its first bad (the first such variants, on cpu)."""
    ends = [
        _pinned_at(repro, truth.package, v) if v else None
        for v in (truth.last_good, truth.first_bad)
    ]
    if None in ends:
        why = (
            f"no two variants pin {truth.package} at {truth.last_good} and {truth.first_bad} "
            "(the attribution's ends)"
        )
        return Question(repro.name, "attribution", (), truth, unasked=why)
    start, end = (str(lock_path(repro, v, "cpu")) for v in ends if v is not None)
    return Question(repro.name, "attribution", ("attribute", repro.name, "--variant", variant,
                    "--from", start, "--to", end, "--json"), truth)  # fmt: skip


def _pinned_at(repro: Repro, package: str, version: str) -> str | None:
    """The first variant (on cpu) whose pins hold `package==version`."""
    name = canonicalize_name(package)
    for variant in repro.variants_on("cpu"):
        for text in repro.requirements(variant, "cpu"):
            requirement = Requirement(text)
            specs = list(requirement.specifier)
            if (
                canonicalize_name(requirement.name) == name
                and len(specs) == 1
                and specs[0].operator == "=="
                and Version(specs[0].version) == Version(version)
            ):
                return variant
    return None


def _holds_edge(good: str, bad: str, truth: TruthSection) -> bool:
    """Whether good .. bad holds the breaking edge and no fix (one answer is right)."""
    if truth.last_good is None:
        return False
    first_bad = Version(truth.first_bad)
    fixed = Version(truth.first_fixed) if truth.first_fixed else None
    return (
        Version(good) <= Version(truth.last_good)
        and first_bad <= Version(bad)
        and (fixed is None or Version(bad) < fixed)
    )


def _broken(repro: Repro) -> str:
    """The variant a search runs: the first default one expected to reproduce."""
    for name in repro.default_variants:
        if repro.variant(name).expect == "reproduced":
            return name
    return repro.default_variants[0]


def ask_cases(
    cases: Sequence[Sequence[Question]],
    ask: Ask,
    at_once: int,
    on_interrupt: Callable[[BaseException], None] | None = None,
) -> list[Answer]:
    """Each case's questions in order, `at_once` cases at a time (threads: each question is
    a CLI process); the answers in the cases' order. On an interrupt (Ctrl-C, SIGTERM) no
    further question is asked and `on_interrupt` stops the ones running and waits for them
    to end (the CLI passes the signal on to its children and waits for each); then the
    interrupt propagates."""
    stop = threading.Event()

    def one_case(items: Sequence[Question]) -> list[Answer]:
        answers = []
        for question in items:
            if stop.is_set():
                break
            if question.unasked:
                no = Reply(code=2, data=None, cpu_s=0.0, wall_s=0.0, error=question.unasked)
                answers.append(grade(question, no))
                continue
            answers.append(grade(question, ask(question.args)))
        return answers

    pool = ThreadPoolExecutor(max_workers=max(1, at_once))
    try:
        futures = [pool.submit(one_case, items) for items in cases]
        # short waits: a signal that landed on a worker thread is handled here within one
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=WAKE_S)
        done = [future.result() for future in futures]
    except BaseException as exc:
        stop.set()
        if on_interrupt is not None:
            on_interrupt(exc)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [answer for answers in done for answer in answers]


def grade(question: Question, reply: Reply) -> Answer:
    """Hold one reply against the truth."""
    data = reply.data if isinstance(reply.data, dict | list) else None
    if data is None:
        why = reply.error or f"exit {reply.code}, no JSON"
        return _answer(question, "refused", "(no answer)", why, 0, reply)
    if question.kind == "verdicts":
        return _grade_verdicts(question, data, reply)
    if question.kind == "attribution":
        return _grade_attribution(question, data, reply)
    return _grade_search(question, data, reply)


def _grade_attribution(question: Question, data: Any, reply: Reply) -> Answer:
    """Right: the truth's package at its first bad release; a refusal: no culprit claimed
    (flaky, non-monotone, a set or release left open); wrong: any other culprit claimed."""
    summary = data.get("summary", data) if isinstance(data, dict) else {}
    line = str(summary.get("result") or "(no result line)")
    runs = int(summary.get("runs") or 0)
    status, truth = summary.get("status"), question.truth
    if status != "found":
        return _answer(question, "refused", line, f"status {status}", runs, reply)
    # the culprit: the summary's `details` (--json version 2), its top level in version 1
    details = summary.get("details")
    own = details if isinstance(details, dict) else summary
    package, first = own.get("package"), summary.get("first")
    named = f"{package} {first}" if package else " + ".join(own.get("culprit") or [])
    if package == canonicalize_name(truth.package) and first == truth.first_bad:
        return _answer(question, "right", line, f"culprit {named}", runs, reply)
    why = f"named {named}, the truth is {truth.package} {truth.first_bad}"
    return _answer(question, "wrong", line, why, runs, reply)


def _answer(q: Question, g: Grade, line: str, why: str, runs: int, reply: Reply) -> Answer:
    return Answer(q, g, line, why, runs, reply.cpu_s, reply.wall_s)


def _grade_verdicts(question: Question, data: Any, reply: Reply) -> Answer:
    records = data.get("records", data) if isinstance(data, dict) else data
    shown, wrong, refused = [], [], []
    for record in records if isinstance(records, list) else []:
        label = f"{record.get('variant', '?')}: {record.get('verdict')}"
        shown.append(label)
        status, verdict = record.get("status"), record.get("verdict")
        if status == "match":
            continue
        if verdict in ("clean", "reproduced"):  # a verdict that misses its expectation
            wrong.append(f"{label} (expected {record.get('expect')})")
        else:
            refused.append(f"{label} ({status})")
    line = ", ".join(shown) or "(no records)"
    runs = len(shown)
    if wrong:
        return _answer(question, "wrong", line, "; ".join(wrong), runs, reply)
    if refused or not shown:
        return _answer(question, "refused", line, "; ".join(refused) or "no records", runs, reply)
    return _answer(question, "right", line, "every default verdict as expected", runs, reply)


def _grade_search(question: Question, data: Any, reply: Reply) -> Answer:
    summary = data.get("summary", data) if isinstance(data, dict) else {}
    line = str(summary.get("result") or "(no result line)")
    runs = int(summary.get("runs") or 0)
    status = summary.get("status")
    truth = question.truth
    if question.kind == "bisect":
        edge = truth.first_fixed if question.edge == "fixing" else truth.first_bad
        if status == "found":
            first = summary.get("first")
            if first == edge:
                why = f"{question.edge} edge {first}"
                return _answer(question, "right", line, why, runs, reply)
            why = f"named {first}, the truth is {edge}"
            return _answer(question, "wrong", line, why, runs, reply)
        if status == "no-change":
            why = f"no change claimed; the truth: {truth.last_good} -> {truth.first_bad}"
            if question.edge == "fixing":
                why = f"no change claimed; the truth: fixed in {truth.first_fixed}"
            return _answer(question, "wrong", line, why, runs, reply)
        return _answer(question, "refused", line, f"status {status}", runs, reply)
    if status != "mapped":
        return _answer(question, "refused", line, f"status {status}", runs, reply)
    # the map: the summary's `details` (--json version 2), its top level in version 1
    details = summary.get("details")
    the_map = details if isinstance(details, dict) else summary
    found = the_map.get("events") or []  # an event each: {"introduced": V} or {"fixed": V}
    events = {
        "introduced": [e["introduced"] for e in found if e.get("introduced")],
        "fixed": [e["fixed"] for e in found if e.get("fixed")],
    }
    expected = {
        "introduced": [truth.first_bad],
        "fixed": [truth.first_fixed] * bool(truth.first_fixed),
    }
    if question.span == "breaking":  # last good .. first bad: no fix inside
        expected["fixed"] = []
    elif question.span == "fixing":  # last bad .. first fixed: it began at or before
        expected["introduced"] = [truth.last_bad or ""]
    # an edge the range cannot see past ("at or before": untested before it) is a fact only
    # where the truth has nothing before it either (a bug born with its feature), or where
    # the question was the fix alone
    seen_before = not truth.last_good or question.span == "fixing"
    unseen = [
        f"{kind} {e[kind]}"
        for e in found
        for kind in ("introduced", "fixed")
        if e.get(kind) and e.get("bound") and not (kind == "introduced" and seen_before)
    ]
    if events == expected and not unseen:
        return _answer(question, "right", line, f"events {events}", runs, reply)
    if events == expected:
        why = f"events {events}, but {', '.join(unseen)} only as a bound"
        return _answer(question, "refused", line, why, runs, reply)
    if the_map.get("untested"):  # ranges with holes: nothing claimed about those releases
        why = f"events {events} with untested {the_map.get('untested')}"
        return _answer(question, "refused", line, why, runs, reply)
    why = f"events {events}, the truth {expected}"
    return _answer(question, "wrong", line, why, runs, reply)


@dataclass
class Totals:
    answers: list[Answer] = field(default_factory=list)

    def count(self, grade: Grade) -> int:
        return sum(a.grade == grade for a in self.answers)

    @property
    def accuracy(self) -> float | None:
        return self.count("right") / len(self.answers) if self.answers else None

    @property
    def median_wall_s(self) -> float | None:
        return median(a.wall_s for a in self.answers) if self.answers else None


def markdown(answers: Sequence[Answer], command: str) -> str:
    """docs/corpus.md: a row per case and question, then the totals."""
    totals = Totals(list(answers))
    rows = [
        "| case | package | question | answer | grade | why | runs | CPU s | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in answers:
        q = a.question
        cells = [q.case, q.truth.package, q.label, a.line, a.grade, a.why, str(a.runs),
                 f"{a.cpu_s:.0f}", f"{a.wall_s:.0f}"]  # fmt: skip
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    accuracy = totals.accuracy
    median_wall = totals.median_wall_s
    lines = [
        "# The corpus: real regressions, answered",
        "",
        "Written by `" + command + "`: each corpus repro (a repro with a `[truth]`) asked "
        "the questions its truth answers, each answer graded against that truth. A wrong "
        "answer is one printed as certain that the truth contradicts; an undecided, flaky or "
        "failed question is a refusal.",
        "",
        *rows,
        "",
        f"- questions: {len(answers)}; right: {totals.count('right')}; honest refusals: "
        f"{totals.count('refused')}; **wrong answers printed as certain: "
        f"{totals.count('wrong')}**",
        f"- accuracy: {accuracy:.3f}" if accuracy is not None else "- accuracy: -",
        f"- median time to an answer: {median_wall:.0f} s"
        if median_wall is not None
        else "- median time to an answer: -",
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
