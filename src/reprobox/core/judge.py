"""Decide a verdict from measured metrics, and judge it against the expectation.

The script reports its own verdict, but the harness recomputes it from the metrics with the
rule in repro.toml: a verdict that the numbers do not support is an error, not a result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from reprobox.core.errors import LaunchError
from reprobox.core.protocol import Expectation, Verdict
from reprobox.core.spec import Rule


class Status(StrEnum):
    MATCH = "match"  # verdict equals the expectation (or an accepted alternative)
    MISMATCH = "mismatch"
    RECORDED = "recorded"  # expectation `unknown`: measured, not judged
    ERROR = "error"  # no verdict: the run failed


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


def judge(verdict: Verdict, expect: Expectation, also_ok: Iterable[Verdict] = ()) -> Status:
    if expect is Expectation.UNKNOWN:
        return Status.RECORDED
    if verdict.value == expect.value or verdict in set(also_ok):
        return Status.MATCH
    return Status.MISMATCH
