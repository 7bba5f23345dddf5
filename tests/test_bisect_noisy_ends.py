"""Ends that disagree with --good/--bad are launched again before the range or the order is
blamed: ends that then disagree with themselves are noise, said with the counts and the two
ways that handle it (exit 1, never bad input); ends that agree with themselves keep the
"both ends" and "right way round" refusals (exit 2). Runs are fake (a scripted verdict per
attempt); the driver, the prober, the log and the checks are real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bisect_fakes import C, R, hist_target, transformers_history, transformers_index

from reprobox.bisect.checks import REPEAT_ENDS, NoisyEnds
from reprobox.bisect.prober import BisectError
from reprobox.bisect.releases import release_bisect
from reprobox.bisect.strategy import Strategy
from reprobox.core.errors import BadInput, ExitCode


def _bisect(tmp_path: Path, good: str, bad: str, workers: int = 1, **by_attempt: list) -> tuple:
    history = transformers_history()
    history.by_attempt = {k.replace("_", "."): v for k, v in by_attempt.items()}
    log = tmp_path / "log.jsonl"
    with pytest.raises((NoisyEnds, BisectError)) as caught:
        release_bisect(
            hist_target(tmp_path), "transformers", good, bad, transformers_index(),
            probes=history.probes, log_path=log, strategy=Strategy(workers=workers),
        )  # fmt: skip
    return caught.value, history, log


def test_a_flaky_good_end_is_named_noisy_with_its_counts(tmp_path: Path) -> None:
    # 4.46.3 is clean but reproduces once in three; 4.48.0 reproduces every time. Before: one
    # launch of each, "--good 4.46.3 is reproduced, not clean: both ends are reproduced, so
    # either no release between them changes the verdict, or ..." (exit 2, no word of noise).
    error, history, log = _bisect(tmp_path, "4.46.3", "4.48.0", **{"4_46_3": [R, C, C]})
    assert isinstance(error, NoisyEnds) and not isinstance(error, BadInput)
    assert error.exit_code == ExitCode.FAILED == 1
    assert str(error) == (
        "flaky: the ends gave different verdicts when repeated (--good 4.46.3: 1 of 3 "
        "launches reproduced; --bad 4.48.0: 3 of 3): the outcome is noisy, so one launch of "
        "each end cannot tell whether the range or the order of the ends is wrong; no boundary "
        "claimed: rerun this bisect with --flaky (a posterior over every candidate, each "
        "launch weighed), or declare [verdict] repeats for the variant (repros/README.md, "
        '"Noisy outcomes")'
    )
    assert sorted(history.calls) == [("4.46.3", a) for a in (1, 2, 3)] + [
        ("4.48.0", a) for a in (1, 2, 3)
    ]
    kept = [json.loads(line) for line in log.read_text().splitlines()[1:]]  # past the header
    assert len(kept) == 2 * REPEAT_ENDS  # every launch is kept: a rerun resumes, not relaunches


def test_a_flaky_bad_end_is_named_noisy_with_its_counts(tmp_path: Path) -> None:
    # 4.48.0 reproduces two times in three, clean at its first launch: both ends clean at once.
    error, _, _ = _bisect(tmp_path, "4.46.3", "4.48.0", workers=2, **{"4_48_0": [C, R, R]})
    assert isinstance(error, NoisyEnds)
    assert "(--good 4.46.3: 0 of 3 launches reproduced; --bad 4.48.0: 2 of 3)" in str(error)
    assert "both ends" not in str(error) and "\n" not in str(error)


def test_noisy_ends_that_look_reversed_are_noise_not_the_order(tmp_path: Path) -> None:
    error, _, _ = _bisect(
        tmp_path, "4.46.3", "4.48.0", **{"4_46_3": [R, C, R], "4_48_0": [C, R, R]}
    )
    assert isinstance(error, NoisyEnds)
    assert "(--good 4.46.3: 2 of 3 launches reproduced; --bad 4.48.0: 2 of 3)" in str(error)
    assert "right way round" not in str(error)


def test_a_truly_reversed_order_is_still_named_as_such(tmp_path: Path) -> None:
    error, history, _ = _bisect(tmp_path, "4.45.0", "4.46.1")  # the same every launch
    assert isinstance(error, BisectError) and error.exit_code == ExitCode.BAD_INPUT == 2
    assert str(error) == (
        "--good 4.45.0 is reproduced, not clean, and --bad 4.46.1 is clean, in 3 launches "
        "each: are --good and --bad the right way round?"
    )
    assert len(history.calls) == 2 * REPEAT_ENDS


def test_a_truly_unchanged_range_says_both_ends_clean(tmp_path: Path) -> None:
    error, _, _ = _bisect(tmp_path, "4.46.1", "4.46.3")  # clean every launch
    assert isinstance(error, BisectError) and error.exit_code == ExitCode.BAD_INPUT
    assert str(error).startswith(
        "--bad 4.46.3 is clean, not reproduced: both ends are clean in 3 launches each, so "
        "either no release between them changes the verdict"
    )


def test_ends_as_said_are_launched_once(tmp_path: Path) -> None:
    history = transformers_history()
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.48.1", "4.48.0", transformers_index(),
        probes=history.probes, strategy=Strategy(confirm=0),
    )  # fmt: skip
    assert summary.status == "found" and sorted(history.calls) == [("4.48.0", 1), ("4.48.1", 1)]


def test_the_cli_exits_1_on_noisy_ends_and_2_on_reversed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reprobox.bisect import releases
    from reprobox.cli import cells as cli_cells
    from reprobox.cli import main as cli_main

    hist_target(tmp_path)
    (tmp_path / "fixes").mkdir()
    (tmp_path / "noxfile.py").write_text("")
    monkeypatch.setenv("REPROBOX_ROOT", str(tmp_path))
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(cli_cells, "index", lambda args: transformers_index())
    history = transformers_history()
    history.by_attempt = {"4.46.3": [R, C, C]}
    monkeypatch.setattr(releases, "release_probes", lambda *args: history.probes)
    args = ["bisect", "hist", "--package", "transformers", "--variant", "broken"]
    code = cli_main.main([*args, "--good", "4.46.3", "--bad", "4.48.0"])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after a line per probe
    assert code == 1, err
    assert err.startswith("reprobox: error: flaky: the ends gave different verdicts when")
    assert "rerun this bisect with --flaky" in err
    code = cli_main.main([*args, "--good", "4.45.0", "--bad", "4.46.1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.endswith("are --good and --bad the right way round?"), err


def test_a_verify_probe_that_disagrees_with_itself_is_named_noisy(tmp_path: Path) -> None:
    # the answer's clean side holds 4.48.0, which reproduces at its first verify launch only
    history = transformers_history()
    history.by_attempt = {"4.48.0": [R, C, C]}
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=2), probes=history.probes,
    )  # fmt: skip
    assert summary.status == "non-monotone"  # exit 1, as any flaky answer: never found
    [against] = summary.contradictions
    assert (against.item, against.source) == (
        "4.48.0",
        "verify probe: 1 of 3 launches reproduced, so the outcome is noisy",
    )
    assert "(verify probe: 1 of 3 launches reproduced, so the outcome is noisy)" in summary.result
    assert "rerun with --flaky" in summary.result
    consistent = transformers_history()  # 4.48.0 reproduces every time: a real second change
    again = release_bisect(
        hist_target(tmp_path / "b"), "transformers", "4.49.0", "4.47.0", transformers_index(),
        strategy=Strategy(verify=2), probes=consistent.probes,
    )  # fmt: skip
    assert [c.source for c in again.contradictions] == ["verify probe"]
    assert consistent.calls.count(("4.48.0", 3)) == 1  # launched three times all the same


def test_a_boundary_that_disagrees_on_confirmation_is_named_with_its_counts(
    tmp_path: Path,
) -> None:
    # 4.47.0 reproduces at its first launch and not at its second (--confirm 2)
    history = transformers_history()
    history.by_attempt = {"4.47.0": [R, C, R, R]}
    summary = release_bisect(
        hist_target(tmp_path), "transformers", "4.46.1", "4.47.0", transformers_index(),
        probes=history.probes, log_path=tmp_path / "log.jsonl", strategy=Strategy(confirm=2),
    )  # fmt: skip
    assert summary.status == "flaky", summary.result
    assert summary.result.startswith(
        "flaky: transformers 4.47.0 (reproduced in 1 of 2 launches) gave different verdicts"
    ), summary.result
