"""The prober with injected runs (no uv, no ranks): how a run's record is classified, what a
skip and a stop look like, same-environment reuse, and resuming a bisect killed mid-way."""

from __future__ import annotations

from pathlib import Path

import pytest
from bisect_fakes import C, FakeHistory, R, hist_target, transformers_history, transformers_index

from reprobox.bisect.probe_log import ProbeLog
from reprobox.bisect.prober import Outcome, ProbeFailed, Prober, Probes, classify
from reprobox.bisect.releases import release_bisect
from reprobox.core.errors import BadInput, EnvError, ExitCode, ReproboxError
from reprobox.core.records import Record

HEADER = {"kind": "release", "repro": "hist", "package": "transformers"}


def _record(verdict: str | None, exit_code: int = 0, reason: str = "") -> Record:
    return Record(
        repro="hist", variant="broken", label="broken", expect="unknown",
        status="recorded" if verdict else "error", verdict=verdict, exit_code=exit_code,
        reason=reason, wall_s=2.0, preflight_s=0.5, dir="results/run",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("verdict", "code", "kind"),
    [
        ("clean", 0, "verdict"),
        ("reproduced", 0, "verdict"),
        ("cannot_test", 0, "skip"),  # 125: the variant cannot be tested here
        (None, ExitCode.ENV_FAILED, "skip"),  # the environment could not be installed
        (None, ExitCode.RUN_FAILED, "error"),  # a rank crashed
        (None, ExitCode.TIMEOUT, "error"),
        (None, ExitCode.INTEGRITY, "error"),  # a tampered lock is never a skip
        (None, ExitCode.HARNESS_FAILED, "error"),
        (None, ExitCode.BAD_INPUT, "error"),  # not from resolution: resolution is env_key's
    ],
)
def test_a_records_outcome(verdict: str | None, code: int, kind: str) -> None:
    outcome = classify(_record(verdict, code, "why"))
    assert outcome.kind == kind
    assert outcome.wall_s == 2.5  # preflight and launch
    assert outcome.record == "results/run"
    if kind == "error":
        assert outcome.exit_code == code and outcome.reason == "why"


def test_an_interrupted_probe_interrupts_the_bisect() -> None:
    with pytest.raises(KeyboardInterrupt):
        classify(_record(None, ExitCode.INTERRUPTED, "interrupted"))


def _prober(tmp_path: Path, probes: Probes[str]) -> Prober[str]:
    return Prober(probes, ProbeLog(tmp_path / "probes.jsonl", HEADER))


@pytest.mark.parametrize("error", [EnvError("cannot resolve: no wheel"), BadInput("no version")])
def test_an_environment_that_cannot_be_made_is_a_skip(tmp_path: Path, error: Exception) -> None:
    def env_key(item: str) -> str:
        raise error

    history = FakeHistory({"1.0": C})
    prober = _prober(tmp_path, Probes(run=history.run, env_key=env_key))
    assert prober("1.0", 1) is None
    entry = prober.log.get("1.0#1")
    assert entry is not None and entry.skip and entry.reason == str(error)
    assert history.calls == []  # nothing launched


def test_a_failed_probe_stops_with_one_line_naming_it(tmp_path: Path) -> None:
    def run(item: str, attempt: int) -> Outcome:
        return Outcome("error", reason="rank 1 died of SIGSEGV", exit_code=ExitCode.RUN_FAILED)

    prober = _prober(tmp_path, Probes(run=run, env_key=str))
    with pytest.raises(ProbeFailed) as caught:
        prober("4.48.0", 1)
    message = str(caught.value)
    assert message.startswith("probe 4.48.0 failed (rank 1 died of SIGSEGV)")
    assert str(prober.log.path) in message and "\n" not in message
    assert caught.value.exit_code == ExitCode.RUN_FAILED
    assert prober.log.entries == {}  # a failed probe is not logged: the next run retries it


def test_a_stop_never_carries_a_verdicts_exit_code(tmp_path: Path) -> None:
    def run(item: str, attempt: int) -> Outcome:
        return Outcome("error", reason="odd", exit_code=1)

    with pytest.raises(ProbeFailed) as caught:
        _prober(tmp_path, Probes(run=run, env_key=str))("1.0", 1)
    assert caught.value.exit_code == ExitCode.RUN_FAILED


def test_a_lock_that_fails_its_integrity_check_stops(tmp_path: Path) -> None:
    def env_key(item: str) -> str:
        raise ReproboxError("lock hash mismatch", exit_code=ExitCode.INTEGRITY)

    with pytest.raises(ProbeFailed) as caught:
        _prober(tmp_path, Probes(run=FakeHistory({}).run, env_key=env_key))("1.0", 1)
    assert caught.value.exit_code == ExitCode.INTEGRITY


def test_items_resolving_to_one_environment_share_one_run(tmp_path: Path) -> None:
    history = FakeHistory(
        {"2023-10-01": R, "2023-10-02": R, "2023-10-03": C},
        env={"2023-10-01": "e1", "2023-10-02": "e1", "2023-10-03": "e2"},
    )
    prober = _prober(tmp_path, history.probes)
    assert [prober(d, 1) for d in ("2023-10-01", "2023-10-02", "2023-10-03")] == [R, R, C]
    assert history.items_run() == ["2023-10-01", "2023-10-03"]
    shared = prober.log.get("2023-10-02#1")
    assert shared is not None and shared.same_as == "2023-10-01" and not shared.fresh
    assert prober("2023-10-02", 2) is R  # a confirmation re-run is a run of its own
    assert history.calls[-1] == ("2023-10-02", 2)


def test_a_bisect_killed_mid_way_resumes_without_rerunning(tmp_path: Path) -> None:
    target = hist_target(tmp_path)
    index = transformers_index()
    first = transformers_history()
    first.interrupt_after = 3  # killed during the fourth probe
    with pytest.raises(KeyboardInterrupt):
        release_bisect(target, "transformers", "4.46.1", "4.44.2", index, probes=first.probes)
    assert len(first.calls) == 3

    again = transformers_history()
    summary = release_bisect(target, "transformers", "4.46.1", "4.44.2", index, probes=again.probes)
    assert not set(again.calls) & set(first.calls)  # what was measured is never re-run
    resumed = [p.item for p in summary.probes if p.resumed]
    assert resumed == [item for item, _ in first.calls]
    assert summary.status == "found" and summary.first == "4.46.0"
    assert summary.launched == len(again.calls)


def test_a_changed_verdict_rule_starts_a_new_log_instead_of_resuming(tmp_path: Path) -> None:
    """Probes judged by another `[verdict]` (an effect corrected, a budget raised) never
    answer the new question: the same bisect resumes only under the same rule."""
    index = transformers_index()
    target = hist_target(tmp_path)
    first = release_bisect(
        target, "transformers", "4.46.1", "4.44.2", index, probes=transformers_history().probes
    )
    toml = (tmp_path / "repros" / "hist" / "repro.toml").read_text()
    changed = hist_target(tmp_path, toml.replace("above = 0.0", "above = 0.1"))
    again = transformers_history()
    summary = release_bisect(
        changed, "transformers", "4.46.1", "4.44.2", index, probes=again.probes
    )
    assert again.calls and not any(p.resumed for p in summary.probes)
    assert summary.first == first.first == "4.46.0"
