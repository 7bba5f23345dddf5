"""The verdict comes from metrics; the script's own word is only cross-checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reprobox.core.errors import LaunchError
from reprobox.core.judge import Status, decide, status_for
from reprobox.core.protocol import Expectation, Verdict, read_result
from reprobox.core.spec import Rule

RULES = [Rule(metric="diff", above=1e-6), Rule(metric="kl", above=0.0)]


def test_any_rule_firing_means_reproduced() -> None:
    verdict, why = decide(Verdict.REPRODUCED, {"diff": 0.0, "kl": 0.002}, RULES)
    assert verdict is Verdict.REPRODUCED
    assert "kl=0.002 > 0" in why
    assert decide(Verdict.CLEAN, {"diff": 1e-7, "kl": 0.0}, RULES)[0] is Verdict.CLEAN


def test_a_script_verdict_the_metrics_contradict_is_an_error() -> None:
    with pytest.raises(LaunchError, match="script says clean but its metrics say reproduced"):
        decide(Verdict.CLEAN, {"diff": 0.1, "kl": 0.0}, RULES)


def test_a_missing_metric_is_an_error() -> None:
    with pytest.raises(LaunchError, match="no metric 'kl'"):
        decide(Verdict.CLEAN, {"diff": 0.0}, RULES)


def test_cannot_test_needs_no_metrics() -> None:
    assert decide(Verdict.CANNOT_TEST, {}, RULES)[0] is Verdict.CANNOT_TEST


def test_judge() -> None:
    assert status_for(Verdict.CLEAN, Expectation.CLEAN) is Status.MATCH
    assert status_for(Verdict.REPRODUCED, Expectation.CLEAN) is Status.MISMATCH
    assert status_for(Verdict.CANNOT_TEST, Expectation.CLEAN, [Verdict.CANNOT_TEST]) is Status.MATCH
    assert status_for(Verdict.REPRODUCED, Expectation.UNKNOWN) is Status.RECORDED
    # A repro that "reproduces" where it must not is as wrong as one that never does.
    assert (
        status_for(Verdict.REPRODUCED, Expectation.CLEAN, [Verdict.CANNOT_TEST]) is Status.MISMATCH
    )


def _result(**over: object) -> dict:
    base = {"schema": 1, "variant": "v", "verdict": "clean", "metrics": {"m": 0.0}}
    return {**base, **over}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"schema": 1, "verdict": "cle', "not valid JSON (half-written?)"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps(_result(schema=7)), "has schema 7"),
        (json.dumps(_result(verdict="maybe")), "no valid verdict"),
        (json.dumps(_result(metrics={"m": "high"})), "'metrics' must map names to numbers"),
        (json.dumps(_result(metrics={"m": float("nan")})), "'metrics' must map names to numbers"),
    ],
)
def test_bad_results_are_errors_not_verdicts(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "result.json"
    path.write_text(text)
    with pytest.raises(LaunchError, match=re.escape(message)):
        read_result(path)


def test_missing_result(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="no result written"):
        read_result(tmp_path / "nothing.json")


def test_exit_statuses_must_agree_with_the_result() -> None:
    from reprobox.core.judge import exit_problem
    from reprobox.core.protocol import RankExit

    clean, reproduced = [Verdict.CLEAN], [Verdict.REPRODUCED]
    assert exit_problem([RankExit(rank=0, code=0), RankExit(rank=1, code=0)], clean) is None
    segv = exit_problem([RankExit(rank=0, code=0), RankExit(rank=1, code=-11)], clean)
    assert segv == "rank 1 was killed by SIGSEGV"
    own = exit_problem([RankExit(rank=0, code=-15), RankExit(rank=1, code=3)], clean)
    assert own is not None and own.startswith("rank 1 exited 3")  # the cause, not the kill
    # torchrun exits 1 for any failed worker; its failures block lists the workers
    torchrun = [RankExit(rank=None, code=1), RankExit(rank=0, code=1)]
    assert exit_problem(torchrun, reproduced) is None
    assert exit_problem([RankExit(rank=None, code=1)], clean) is not None
    # a peer the launcher stopped after rank 0 exited with the verdict's code
    stopped = [*torchrun, RankExit(rank=1, code=-15)]
    assert exit_problem(stopped, reproduced, launcher_stops_peers=True) is None
    assert exit_problem(stopped, reproduced, launcher_stops_peers=False) is not None
    # a batch exits with the code of all its cases together
    assert exit_problem([RankExit(rank=0, code=1)], [Verdict.CLEAN, Verdict.REPRODUCED]) is None
