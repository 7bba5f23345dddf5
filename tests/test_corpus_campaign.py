"""The corpus campaign's grading (scaleout/corpus.py), with canned CLI answers: a wrong
answer printed as certain is counted as wrong wherever it comes from (a verdict that misses,
a boundary elsewhere, "no change" over an edge, a sweep's other ranges); anything that
claims nothing is a refusal, never right."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fakes import repro_toml, write_repro
from reprobox.core import spec
from reprobox.scaleout import corpus

TRUTH = """
[truth]
package = "flagpkg"
last_good = "1.1.0"
first_bad = "1.2.0"
first_fixed = "1.4.0"
symptom = "value"
verified = "every release 1.0.0 - 1.4.0, one launch each"
"""


def _repro(root: Path, extra: str = "") -> spec.Repro:
    toml = repro_toml(title="t", pins=("torch==2.13.0", "flagpkg==1.2.0")) + TRUTH + extra
    write_repro(root, "case", toml)
    return spec.load(root, "case")


def _reply(data: Any, code: int = 0) -> corpus.Reply:
    return corpus.Reply(code=code, data=data, cpu_s=2.0, wall_s=3.0)


def _search(status: str, **fields: Any) -> dict[str, Any]:
    return {"summary": {"status": status, "result": f"line {status}", "runs": 6, **fields}}


def _swept(events: list[dict[str, str]], **more: Any) -> dict[str, Any]:
    """A sweep's --json document: the map in the summary's `details` (version 2)."""
    return _search("mapped", kind="sweep", details={"kind": "sweep", "events": events, **more})


def test_the_questions_come_from_the_truth_and_a_bisect_range_that_holds_the_edge(
    scratch_root: Path,
) -> None:
    plain = corpus.questions(_repro(scratch_root))
    assert [q.kind for q in plain] == ["verdicts", "bisect", "sweep"]
    assert plain[1].args[-5:] == ("--good", "1.1.0", "--bad", "1.2.0", "--json")
    assert plain[2].args[-3:] == ("--range", ">=1.1.0,<=1.4.0", "--json")
    wide = '[bisect]\npackage = "flagpkg"\nvariant = "broken"\ngood = "1.0.0"\nbad = "1.3.0"\n'
    assert corpus.questions(_repro(scratch_root, wide))[1].args[-5:-1] == (
        "--good", "1.0.0", "--bad", "1.3.0"
    )  # fmt: skip
    past_fix = wide.replace('bad = "1.3.0"', 'bad = "1.4.0"')  # two answers: not used
    assert corpus.questions(_repro(scratch_root, past_fix))[1].args[-5:-1] == (
        "--good", "1.1.0", "--bad", "1.2.0"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "data", "grade"),
    [
        ("bisect", _search("found", first="1.2.0"), "right"),
        ("bisect", _search("found", first="1.3.0"), "wrong"),
        ("bisect", _search("no-change"), "wrong"),
        ("bisect", _search("undecided", first="1.2.0"), "refused"),
        ("bisect", _search("flaky"), "refused"),
        ("bisect", None, "refused"),
        ("sweep", _swept([{"introduced": "1.2.0"}, {"fixed": "1.4.0"}]), "right"),
        ("sweep", _swept([{"introduced": "1.3.0"}, {"fixed": "1.4.0"}]), "wrong"),
        ("sweep", _swept([{"introduced": "1.2.0"}]), "wrong"),  # no fix seen
        ("sweep", _swept([], untested=["1.2.0"]), "refused"),
        ("sweep", _swept([]), "wrong"),
        # the edges right, but the introduction only "at or before" (the range began at it):
        # the truth's last good release was never seen clean
        ("sweep", _swept([{"introduced": "1.2.0", "bound": True}, {"fixed": "1.4.0"}]),
         "refused"),
        # a document of version 1 kept the map at the summary's top level
        ("sweep", _search("mapped", events=[{"introduced": "1.2.0"}, {"fixed": "1.4.0"}]),
         "right"),
        ("sweep", _search("mapped", events=[{"introduced": "1.3.0"}, {"fixed": "1.4.0"}]),
         "wrong"),
        ("verdicts", {"records": [{"variant": "broken", "status": "match", "verdict":
                                   "reproduced", "expect": "reproduced"}]}, "right"),
        ("verdicts", {"records": [{"variant": "fixed", "status": "mismatch", "verdict":
                                   "reproduced", "expect": "clean"}]}, "wrong"),
        ("verdicts", {"records": [{"variant": "fixed", "status": "error", "verdict": None,
                                   "expect": "clean"}]}, "refused"),
        ("verdicts", {"records": []}, "refused"),
    ],
)  # fmt: skip
def test_each_answer_is_graded_against_the_truth(
    scratch_root: Path, kind: str, data: Any, grade: str
) -> None:
    question = next(q for q in corpus.questions(_repro(scratch_root)) if q.kind == kind)
    answer = corpus.grade(question, _reply(data, code=0 if grade == "right" else 1))
    assert answer.grade == grade, answer


def _noisy(toml: str) -> str:
    """The repro judged by a t-test over 10 launches."""
    return toml.replace(
        "[verdict]\n", '[verdict]\nrepeats = 10\ntest = "t"\nmetric = "level"\nthreshold = 0.0\n'
    )


@pytest.mark.parametrize(
    ("span", "data", "grade"),
    [
        ("breaking", _swept([{"introduced": "1.2.0"}]), "right"),
        ("breaking", _swept([{"introduced": "1.2.0"}, {"fixed": "1.2.0"}]), "wrong"),
        ("breaking", _swept([]), "wrong"),  # "no change" over the edge
        ("breaking", _swept([{"introduced": "1.2.0", "bound": True}]), "refused"),
        # last bad .. first fixed: the bug began at or before the range, as the truth says
        ("fixing", _swept([{"introduced": "1.3.0", "bound": True}, {"fixed": "1.4.0"}]),
         "right"),
        ("fixing", _swept([{"introduced": "1.3.0", "bound": True}]), "wrong"),  # no fix
        ("fixing", _swept([{"introduced": "1.4.0", "bound": True}]), "wrong"),
        ("fixing", _swept([], untested=["1.3.0"]), "refused"),
    ],
)  # fmt: skip
def test_a_noisy_case_sweeps_each_edge_alone(
    scratch_root: Path, span: str, data: Any, grade: str
) -> None:
    """Tens of launches a release: a noisy case with a `last_bad` is swept over each edge's
    two releases (what the truth claims), not every release between the edges."""
    base = repro_toml(title="t", pins=("torch==2.13.0", "flagpkg==1.2.0"))
    write_repro(scratch_root, "case", _noisy(base + TRUTH))
    plain = corpus.questions(spec.load(scratch_root, "case"))
    assert [q.label for q in plain] == ["verdicts", "bisect", "sweep"]  # no last_bad: as ever
    truth = TRUTH.replace('first_fixed = "1.4.0"', 'first_fixed = "1.4.0"\nlast_bad = "1.3.0"')
    write_repro(scratch_root, "case", base + truth)  # one launch a release: the whole range
    assert [q.label for q in corpus.questions(spec.load(scratch_root, "case"))][2:] == ["sweep"]
    write_repro(scratch_root, "case", _noisy(base + truth))
    asked = corpus.questions(spec.load(scratch_root, "case"))
    labels = ["verdicts", "bisect", "sweep (breaking edge)", "sweep (fixing edge)"]
    assert [q.label for q in asked] == labels
    assert asked[2].args[-3:] == ("--range", ">=1.1.0,<=1.2.0", "--json")
    assert asked[3].args[-3:] == ("--range", ">=1.3.0,<=1.4.0", "--json")
    question = next(q for q in asked if q.span == span)
    assert corpus.grade(question, _reply(data)).grade == grade


def test_a_campaign_can_leave_kinds_of_question_out(scratch_root: Path) -> None:
    """`--questions`: an attribution or a sweep of a noisy case can cost hours."""
    repro = _repro(scratch_root)
    assert [q.kind for q in corpus.questions(repro, {"verdicts", "sweep"})] == ["verdicts", "sweep"]
    assert [q.kind for q in corpus.questions(repro)] == list(corpus.KINDS[:3])


BORN_WITH_ITS_FEATURE = TRUTH.replace('last_good = "1.1.0"\n', "")


@pytest.mark.parametrize(
    ("kind", "data", "grade"),
    [
        ("bisect", _search("found", first="1.4.0"), "right"),  # the fixing edge
        ("bisect", _search("found", first="1.2.0"), "wrong"),
        ("bisect", _search("found", first="1.3.0"), "wrong"),
        ("bisect", _search("no-change"), "wrong"),
        ("bisect", _search("undecided"), "refused"),
        # nothing before 1.2.0 can run the check: "at or before" is all there is to see
        ("sweep", _swept([{"introduced": "1.2.0", "bound": True}, {"fixed": "1.4.0"}]),
         "right"),
        ("sweep", _swept([{"introduced": "1.2.0"}, {"fixed": "1.4.0", "bound": True}]),
         "refused"),
        ("sweep", _swept([{"introduced": "1.2.0", "bound": True}]), "wrong"),
    ],
)  # fmt: skip
def test_a_bug_born_with_its_feature_is_asked_its_fixing_edge(
    scratch_root: Path, kind: str, data: Any, grade: str
) -> None:
    toml = repro_toml(title="t", pins=("torch==2.13.0", "flagpkg==1.2.0")) + BORN_WITH_ITS_FEATURE
    write_repro(scratch_root, "case", toml)
    asked = corpus.questions(spec.load(scratch_root, "case"))
    assert [q.kind for q in asked] == ["verdicts", "bisect", "sweep"]
    assert asked[1].args[-5:] == ("--good", "1.4.0", "--bad", "1.2.0", "--json")
    assert asked[2].args[-3:] == ("--range", ">=1.2.0,<=1.4.0", "--json")
    question = next(q for q in asked if q.kind == kind)
    assert corpus.grade(question, _reply(data)).grade == grade


def test_a_bug_born_with_its_feature_and_never_fixed_has_no_bisect_to_ask(
    scratch_root: Path,
) -> None:
    truth = BORN_WITH_ITS_FEATURE.replace('first_fixed = "1.4.0"\n', "")
    toml = repro_toml(title="t", pins=("torch==2.13.0", "flagpkg==1.2.0")) + truth
    write_repro(scratch_root, "case", toml)
    bisect = corpus.questions(spec.load(scratch_root, "case"))[1]
    assert bisect.unasked and not bisect.args
    assert corpus.grade(bisect, _reply(None, code=2)).grade == "refused"


def test_the_table_counts_wrong_answers_apart_and_the_cases_run_k_at_once(
    scratch_root: Path,
) -> None:
    repro = _repro(scratch_root)
    canned = {
        "run": {"records": [{"variant": "broken", "status": "match", "verdict": "reproduced"}]},
        "bisect": _search("found", first="1.3.0"),
        "sweep": _search("undecided"),
    }
    asked: list[Sequence[str]] = []

    def ask(args: Sequence[str]) -> corpus.Reply:
        asked.append(args)
        return _reply(canned[args[0]])

    answers = corpus.ask_cases([corpus.questions(repro)] * 2, ask, at_once=2)
    assert [a.grade for a in answers] == ["right", "wrong", "refused"] * 2
    assert len(asked) == 6
    text = corpus.markdown(answers, "reprobox corpus")
    assert "**wrong answers printed as certain: 2**" in text
    assert (
        "| case | flagpkg | bisect | line found | wrong | named 1.3.0, the truth is 1.2.0 |" in text
    )
    assert "accuracy: 0.333" in text


def test_an_interrupt_stops_the_running_questions_and_asks_no_more(scratch_root: Path) -> None:
    """Ctrl-C during a question: the running ones are told (the CLI passes the signal on to
    its children), none starts after, and the interrupt propagates once they have ended."""
    import signal
    import threading

    repro = _repro(scratch_root)
    told, finished = threading.Event(), threading.Event()
    asked: list[str] = []
    waited: list[bool] = []

    def ask(args: Sequence[str]) -> corpus.Reply:
        asked.append(args[0])
        signal.raise_signal(signal.SIGUSR1)  # the main thread gets the KeyboardInterrupt
        waited.append(told.wait(10))  # the running question is told at once
        finished.set()
        return _reply(None, code=130)

    def on_interrupt(exc: BaseException) -> None:  # as the CLI's: tell them, wait for them
        assert isinstance(exc, KeyboardInterrupt)
        told.set()
        assert finished.wait(10)

    def ctrl_c(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # as Python's SIGINT handler does (xdist's workers ignore SIGINT)

    previous = signal.signal(signal.SIGUSR1, ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            corpus.ask_cases([corpus.questions(repro)], ask, 1, on_interrupt=on_interrupt)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert asked == ["run"], asked  # the bisect and the sweep were never asked
    assert waited == [True], waited


def _cross(root: Path, fixed: bool = True) -> spec.Repro:
    """A case reported in another package than its culprit's (`reported_in`): a variant
    pinning the culprit at its first bad release, and (with `fixed`) one at its last good."""
    variants = {"broken": "reproduced", **({"fixed": "clean"} if fixed else {})}
    toml = repro_toml(
        title="t", pins=("torch==2.13.0", "flagpkg==1.2.0"), variants=variants,
        variant_extra={"fixed": 'pins = ["flagpkg==1.1.0"]\n'},
    ) + TRUTH.replace("symptom =", 'reported_in = "otherpkg"\nsymptom =')  # fmt: skip
    write_repro(root, "case", toml)
    return spec.load(root, "case")


def test_a_cross_package_case_is_asked_the_attribution_between_two_locks(
    scratch_root: Path,
) -> None:
    assert "attribution" not in [q.kind for q in corpus.questions(_repro(scratch_root))]
    repro = _cross(scratch_root)
    question = corpus.questions(repro)[-1]
    locks = repro.dir / "locks"
    assert question.kind == "attribution" and question.args == (
        "attribute", "case", "--variant", "broken", "--from", str(locks / "fixed.cpu.txt"),
        "--to", str(locks / "broken.cpu.txt"), "--json",
    )  # fmt: skip
    # no variant pins the last good release: refused without a run, and said why
    unasked = corpus.questions(_cross(scratch_root, fixed=False))[-1]
    asked: list[Sequence[str]] = []

    def ask(args: Sequence[str]) -> corpus.Reply:
        asked.append(args)
        return _reply(None, code=1)

    [answer] = corpus.ask_cases([[unasked]], ask, at_once=1)
    assert asked == [] and answer.grade == "refused"
    assert answer.why == "no two variants pin flagpkg at 1.1.0 and 1.2.0 (the attribution's ends)"


@pytest.mark.parametrize(
    ("data", "grade"),
    [
        (_search("found", package="flagpkg", first="1.2.0"), "right"),
        (_search("found", package="flagpkg", first="1.3.0"), "wrong"),
        (_search("found", package="otherpkg", first="2.0.0"), "wrong"),
        (_search("found", package=None, culprit=["flagpkg 1.1.0 -> 1.3.0", "x 1 -> 2"]),
         "wrong"),
        (_search("ambiguous", package="flagpkg", first=None, candidates=["1.2.0", "1.3.0"]),
         "refused"),
        (_search("flaky", flaky=["from"]), "refused"),
        (_search("non-monotone", package="flagpkg"), "refused"),
        (None, "refused"),
    ],
)  # fmt: skip
def test_the_attribution_is_graded_against_the_truth(
    scratch_root: Path, data: Any, grade: str
) -> None:
    question = corpus.questions(_cross(scratch_root))[-1]
    answer = corpus.grade(question, _reply(data, code=0 if data else 2))
    assert answer.grade == grade, answer
