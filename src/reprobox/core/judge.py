"""The one judge: a script's result plus how every process of its launch ended -> verdict.

Every path that produces a verdict (venv and container runs, preflights, bisect probes,
results collected from pods, the report) goes through `judge`. It refuses, as an error and
never as a verdict:
- a launch that timed out, or wrote no readable result;
- any process killed by a signal, or exiting with a code other than the one its result
  implies (a rank that crashed after rank 0 wrote "clean" is not clean);
- a verdict its own metrics contradict (the rule in repro.toml decides, per variant);
- a cannot-test without the script's stated reason.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from reprobox.core.errors import ExitCode, LaunchError
from reprobox.core.protocol import Expectation, RankExit, Verdict, launch_exit_code, read_result
from reprobox.core.spec import Rule

# Under torchrun and `accelerate launch` the launcher exits 1 whenever any worker exits
# non-zero (its ChildFailedError), so a reproduced or cannot-test launch shows 1 there.
LAUNCHER_FAILURE_CODE = 1


class Status(StrEnum):
    MATCH = "match"  # verdict equals the expectation (or an accepted alternative)
    MISMATCH = "mismatch"
    RECORDED = "recorded"  # expectation `unknown`: measured, not judged
    ERROR = "error"  # no verdict: the run failed
    UNDECIDED = "undecided"  # repeated launches decided neither way within their budget


@dataclass(frozen=True)
class Launched:
    """What a back end reports about one launch (or preflight)."""

    exits: tuple[RankExit, ...] = ()  # every process whose exit status is known
    timed_out: bool = False
    timeout: float = 0.0
    wall_s: float = 0.0
    logs: Path | None = None  # where a person looks (the run folder)
    last_error: str = ""  # the last exception line any process printed
    # torchrun / `accelerate launch`: once one worker exits, the launcher SIGTERMs the rest
    launcher_stops_peers: bool = False
    stopped: str = "process tree killed"  # what was done to a launch past its timeout

    @property
    def launcher_code(self) -> int | None:
        """The launcher's own exit status (a rank's, for the plain python launcher)."""
        own = [e.code for e in self.exits if e.rank is None]
        if own:
            return own[0]
        return self.exits[0].code if self.exits else None


@dataclass
class Judgement:
    verdict: Verdict | None
    status: Status
    reason: str
    exit_code: ExitCode
    metrics: dict[str, float] = field(default_factory=dict)
    decided_by: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    # repeated launches (core.repeat_verdict): every launch's verdict, metrics, seed and folder,
    # and the test that turned them into this judgement
    samples: list[dict[str, Any]] = field(default_factory=list)
    stat: dict[str, Any] | None = None


def decide(
    script_verdict: Verdict, metrics: Mapping[str, float], rules: Sequence[Rule]
) -> tuple[Verdict, str]:
    """The verdict the metrics support, and which rules fired (a short explanation)."""
    if script_verdict is Verdict.CANNOT_TEST:
        return Verdict.CANNOT_TEST, ""
    fired = []
    for rule in rules:
        if rule.metric not in metrics:
            raise LaunchError(f"the result has no metric {rule.metric!r}, which the rule reads")
        value = metrics[rule.metric]
        if value > rule.above:
            fired.append(f"{rule.metric}={value:.4g} > {rule.above:g}")
    verdict = Verdict.REPRODUCED if fired else Verdict.CLEAN
    if verdict is not script_verdict:
        shown = ", ".join(f"{r.metric}={metrics[r.metric]:.4g}" for r in rules)
        raise LaunchError(
            f"the script says {script_verdict.value} but its metrics say {verdict.value} ({shown})"
        )
    return verdict, "; ".join(fired)


def status_for(verdict: Verdict, expect: Expectation, also_ok: Iterable[Verdict] = ()) -> Status:
    """How a verdict compares with what the cell expects."""
    if expect is Expectation.UNKNOWN:
        return Status.RECORDED
    if verdict.value == expect.value or verdict in set(also_ok):
        return Status.MATCH
    return Status.MISMATCH


def _mismatch_code(verdict: Verdict) -> ExitCode:
    """A missed expectation: FAILED for a verdict about the bug; CANNOT_TEST when the cell
    could not be tested here at all (says nothing about the bug)."""
    return ExitCode.CANNOT_TEST if verdict is Verdict.CANNOT_TEST else ExitCode.FAILED


def exit_problem(
    exits: Sequence[RankExit], verdicts: Sequence[Verdict], launcher_stops_peers: bool = False
) -> str | None:
    """Why these exit statuses contradict the results, or None when they agree.

    The most telling process is named: one that failed on its own (a code outside the
    protocol) before one the harness or launcher then stopped (SIGTERM/SIGKILL). Under a
    launcher that stops a worker's peers once it exits (torchrun), a peer it SIGTERMed after
    another rank exited with the result's code is no contradiction."""
    expected = launch_exit_code(list(verdicts))
    said = ", ".join(sorted({v.value for v in verdicts}))
    ranks = [e for e in exits if e.rank is not None]
    agreed = any(e.code == expected for e in ranks)
    problems: list[tuple[int, str]] = []
    for item in exits:
        who = "the launcher" if item.rank is None else f"rank {item.rank}"
        stopped_peer = launcher_stops_peers and item.rank is not None and agreed
        if stopped_peer and item.code == -signal.SIGTERM:
            continue
        if item.code < 0:
            name = _signal_name(-item.code)
            stopped = -item.code in (signal.SIGTERM, signal.SIGKILL)
            problems.append((2 if stopped else 1, f"{who} was killed by {name}"))
            continue
        allowed = {expected}
        if item.rank is None and expected != 0:
            allowed.add(LAUNCHER_FAILURE_CODE)
        if item.code not in allowed:
            own = item.code not in (0, 1, 125)
            problems.append(
                (0 if own else 3, f"{who} exited {item.code} but the result says {said}")
            )
    if not problems:
        return None
    problems.sort(key=lambda p: p[0])
    first = problems[0][1]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{first}{more}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def judge(
    rules: Sequence[Rule],
    expect: Expectation,
    also_ok: Iterable[Verdict],
    result_path: Path,
    launched: Launched,
    launch_verdicts: Sequence[Verdict] | None = None,
) -> Judgement:
    """The verdict of one cell of a launch.

    `launch_verdicts` are the script verdicts of every case the launch ran (a batch); the
    exit codes are checked against them, since every rank exits with the batch's code."""
    logs = f"; logs in {launched.logs}" if launched.logs else ""
    hint = f"; last error: {launched.last_error}" if launched.last_error else ""
    if launched.timed_out:
        return _error(
            ExitCode.TIMEOUT,
            f"timed out after {launched.timeout:g}s (a hung collective?); {launched.stopped}{logs}",
        )
    try:
        result = read_result(result_path)
    except LaunchError as exc:
        return _error(ExitCode.RUN_FAILED, f"{exc}; {_exits_text(launched.exits)}{hint}{logs}")
    script_verdict = Verdict(result["verdict"])
    problem = exit_problem(
        launched.exits, list(launch_verdicts or [script_verdict]), launched.launcher_stops_peers
    )
    if problem is not None:
        return _error(ExitCode.RUN_FAILED, f"{problem}{hint}{logs}", result)
    if script_verdict is Verdict.CANNOT_TEST and not str(result.get("reason") or "").strip():
        return _error(ExitCode.RUN_FAILED, "cannot_test without a reason in the result", result)
    try:
        verdict, fired = decide(script_verdict, result["metrics"], rules)
    except LaunchError as exc:
        return _error(ExitCode.RUN_FAILED, str(exc), result)
    status = status_for(verdict, expect, also_ok)
    return Judgement(
        verdict=verdict,
        status=status,
        reason=str(result.get("reason") or fired),
        exit_code=_mismatch_code(verdict) if status is Status.MISMATCH else ExitCode.OK,
        metrics=dict(result["metrics"]),
        decided_by=list(dict.fromkeys(rule.metric for rule in rules)),
        result=result,
    )


def peek_verdict(result_path: Path) -> Verdict | None:
    """A result's own verdict if it is readable (to know a batch's expected exit code)."""
    try:
        return Verdict(read_result(result_path)["verdict"])
    except LaunchError:
        return None


def _exits_text(exits: Sequence[RankExit]) -> str:
    if not exits:
        return "no process exit status known"
    shown = ", ".join(
        f"{'launcher' if e.rank is None else f'rank {e.rank}'} "
        + (_signal_name(-e.code) if e.code < 0 else f"exit {e.code}")
        for e in exits
    )
    return shown


def _error(code: ExitCode, reason: str, result: dict[str, Any] | None = None) -> Judgement:
    return Judgement(
        verdict=None, status=Status.ERROR, reason=reason, exit_code=code, result=result or {}
    )
