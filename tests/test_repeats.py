"""The statistical verdict of a noisy cell (core.repeat_verdict), on per-launch judgements made up
here: SPRT over pass/fail, the metric tests against a threshold with planned looks, errors
and cannot-test ending the cell, what the table shows, the spec's checks, and records
without samples still loading."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from conftest import write_repro
from reprobox.cli import verdict as verdict_cli
from reprobox.cli.table_drawing import verdict_rows
from reprobox.core import repeat_verdict, spec, stats
from reprobox.core.errors import ExitCode, SpecError
from reprobox.core.judge import Judgement, Status
from reprobox.core.protocol import Expectation, Verdict
from reprobox.core.records import CellHistory, Record
from reprobox.core.spec import Rule, VerdictSection
from reprobox.run import pipeline

RULE = [Rule(metric="hit", above=0.5)]


def _launch(verdict: Verdict | None, **metrics: float) -> Judgement:
    if verdict is None:
        return Judgement(None, Status.ERROR, "rank 1 was killed by SIGSEGV", ExitCode.RUN_FAILED)
    return Judgement(verdict, Status.MATCH, "", ExitCode.OK, metrics=dict(metrics))


def _judge(section: VerdictSection, launches: list[Judgement], expect: str = "reproduced"):
    samples: list[dict[str, Any]] = [{"repeat": i} for i in range(len(launches))]
    return repeat_verdict.aggregate(section, Expectation(expect), [], launches, samples)


def _coin(rate: float, n: int, seed: int) -> list[Judgement]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        hit = rng.random() < rate
        out.append(_launch(Verdict.REPRODUCED if hit else Verdict.CLEAN, hit=float(hit)))
    return out


NOISY = VerdictSection(reproduced_if=RULE, repeats=20, floor=0.1, effect=0.5)


def test_sprt_decides_reproduced_and_clean_and_says_why() -> None:
    reproduced = _judge(NOISY, [_launch(Verdict.REPRODUCED, hit=1.0)] * 3)
    assert reproduced.verdict is Verdict.REPRODUCED and reproduced.status is Status.MATCH
    assert reproduced.exit_code == ExitCode.OK and reproduced.stat is not None
    assert reproduced.stat["n"] == 3 and reproduced.stat["reproduced"] == 3
    assert reproduced.stat["test"].startswith("SPRT") and 0 < reproduced.stat["p"] < 0.01
    assert "3/3 reproduced" in reproduced.reason and "CI" in reproduced.reason
    clean = _judge(NOISY, [_launch(Verdict.CLEAN, hit=0.0)] * 6, expect="reproduced")
    assert clean.verdict is Verdict.CLEAN and clean.status is Status.MISMATCH
    assert clean.exit_code == ExitCode.FAILED
    assert clean.metrics == {"hit": 0.0}  # the mean over the launches


def test_sprt_left_open_is_undecided_with_its_own_exit_code_never_a_verdict() -> None:
    two = [_launch(Verdict.REPRODUCED, hit=1.0), _launch(Verdict.CLEAN, hit=0.0)]
    open_ = _judge(VerdictSection(reproduced_if=RULE, repeats=2, floor=0.1), two)
    assert open_.verdict is None and open_.status is Status.UNDECIDED
    assert open_.exit_code == ExitCode.UNDECIDED == 8
    assert "undecided after 2 launches" in open_.reason and "budget is spent" in open_.reason
    assert verdict_cli.bisect_code(open_.exit_code) == 125  # git bisect run: skip


@pytest.mark.parametrize(("rate", "want"), [(0.7, Verdict.REPRODUCED), (0.0, Verdict.CLEAN)])
def test_sprt_read_after_every_launch_decides_as_the_toy_e2e_expects(
    rate: float, want: Verdict
) -> None:
    """The loop reads after every launch: 200 runs of the coin at 0.7 and at 0 end right."""
    wrong = 0
    for seed in range(200):
        launches = _coin(rate, NOISY.repeats, seed)  # type: ignore[arg-type]
        for n in range(1, len(launches) + 1):
            out = _judge(NOISY, launches[:n])
            if repeat_verdict.decided(out):
                break
        wrong += out.verdict is not want
    assert wrong <= 4  # alpha = beta = 1%: a couple at most, not a coin's share


def test_a_crash_is_never_a_sample_and_cannot_test_ends_the_cell() -> None:
    crashed = _judge(NOISY, [_launch(Verdict.REPRODUCED, hit=1.0), _launch(None)])
    assert crashed.status is Status.ERROR and crashed.verdict is None and crashed.stat is None
    assert crashed.exit_code == ExitCode.RUN_FAILED and "SIGSEGV" in crashed.reason
    cannot = Judgement(Verdict.CANNOT_TEST, Status.MISMATCH, "no GPU", ExitCode.CANNOT_TEST)
    out = _judge(NOISY, [cannot])
    assert out.verdict is Verdict.CANNOT_TEST and out.exit_code == ExitCode.CANNOT_TEST


def test_metric_t_test_against_the_stated_threshold() -> None:
    section = VerdictSection(
        reproduced_if=[Rule(metric="gap", above=0.0)], repeats=6, test="t", metric="gap",
        threshold=0.0,
    )  # fmt: skip
    high = [_launch(Verdict.REPRODUCED, gap=v) for v in (0.9, 1.1, 1.0, 1.2, 0.8, 1.0)]
    out = _judge(section, high)
    assert out.verdict is Verdict.REPRODUCED and out.stat is not None
    assert out.stat["ci"][0] > 0 and out.stat["n"] == 6 and out.stat["values"][0] == 0.9
    assert "gap = 1 ± " in out.reason and "n=6" in out.reason
    low = [_launch(Verdict.CLEAN, gap=v) for v in (-0.9, -1.1, -1.0, -1.2, -0.8, -1.0)]
    assert _judge(section, low).verdict is Verdict.CLEAN
    both = [_launch(Verdict.CLEAN, gap=v) for v in (-1.0, 1.0, -0.5, 0.5, 0.1, -0.1)]
    assert _judge(section, both).status is Status.UNDECIDED
    # an effect that matters: a mean surely below 0 + 5 is clean, even when surely above 0
    effect = section.model_copy(update={"effect": 5.0})
    assert _judge(effect, both).verdict is Verdict.CLEAN


def test_auto_metric_tests_look_at_planned_points_with_alpha_split() -> None:
    section = VerdictSection(
        reproduced_if=RULE, repeats="auto", test="t", metric="hit", budget=20, alpha=0.03,
        threshold=0.5,
    )  # fmt: skip
    assert repeat_verdict.looks(section) == [5, 10, 20]
    assert repeat_verdict.next_look(section, 0) == 5 and repeat_verdict.next_look(section, 5) == 10
    stat = _judge(section, [_launch(Verdict.CLEAN, hit=v) for v in (0.1, 0.2, 0.3, 0.2, 0.1)]).stat
    assert stat is not None and stat["confidence"] == pytest.approx(0.99)  # 0.03 / 3 looks
    sprt = VerdictSection(reproduced_if=RULE, repeats="auto", budget=7)
    assert repeat_verdict.looks(sprt) == list(range(1, 8)) and repeat_verdict.most(sprt) == 7


def test_the_table_shows_mean_ci_and_n_and_undecided(tmp_path: Path) -> None:
    section = VerdictSection(
        reproduced_if=[Rule(metric="gap", above=0.0)], repeats=3, test="t", metric="gap",
        threshold=0.0,
    )  # fmt: skip
    out = _judge(section, [_launch(Verdict.REPRODUCED, gap=v) for v in (0.9, 1.0, 1.1)])
    record = Record(
        repro="r", variant="v", label="v", expect="reproduced", status="error", verdict=None
    )
    record.dir = str(tmp_path)
    from reprobox.core.judge import Launched

    record.apply(out, Launched())
    row = verdict_rows([record])[0]
    assert row[3] == "reproduced" and "± " in row[5] and "n=3" in row[5]
    open_ = _judge(NOISY.model_copy(update={"repeats": 1}), [_launch(Verdict.CLEAN, hit=0.0)])
    record.apply(open_, Launched())
    row = verdict_rows([record])[0]
    assert row[3] == "undecided" and row[4] == "undecided" and "n=1" in row[5]
    # an undecided record is the cell's newest measurement: no older verdict shown for it
    assert CellHistory.of([(("b", 1.0), record)]).is_measured
    assert pipeline.exit_code([record]) == ExitCode.UNDECIDED
    record.save()
    again = Record.load(tmp_path / "record.json")
    assert again.stat == json.loads(json.dumps(record.stat)) and again.status == "undecided"


def test_a_record_without_samples_still_loads(tmp_path: Path) -> None:
    old = {"schema": 1, "repro": "r", "variant": "v", "label": "v", "expect": "clean",
           "status": "match", "verdict": "clean"}  # fmt: skip
    (tmp_path / "record.json").write_text(json.dumps(old))
    record = Record.load(tmp_path / "record.json")
    assert record.samples == [] and record.stat is None
    assert verdict_rows([record])[0][3] == "clean"


GOOD = """
[repro]
title = "t"
upstream = "u"
script = "script.py"

[launch]
launcher = "python"
processes = 1
timeout = 10

[env]
pins = ["torch==2.0.0"]

[verdict]
reproduced_if = [{ metric = "hit", above = 0.5 }]
REPEATS

[variants.broken]
expect = "reproduced"
"""


@pytest.mark.parametrize(
    ("repeats", "field"),
    [
        ('repeats = "often"', "verdict.repeats"),
        ("repeats = 0", "verdict.repeats"),
        ('repeats = "3"', "verdict.repeats"),
        ("repeats = 4\nalpha = 0.7", "verdict.alpha"),
        ('repeats = 4\ntest = "t"', "verdict.metric"),
        ('repeats = 4\ntest = "t"\nmetric = "other"', "verdict.threshold"),
        ('repeats = 4\ntest = "t"\nmetric = "hit"', "verdict.threshold"),  # no rule's cut
        ('repeats = 4\ntest = "sign"\nmetric = "hit"', "verdict.threshold"),
        ('test = "t"\nmetric = "hit"\nthreshold = 0.0', "verdict.repeats"),
        ('repeats = 1\ntest = "t"\nmetric = "hit"\nthreshold = 0.0', "verdict.repeats"),
        ('repeats = "auto"\ntest = "t"\nmetric = "hit"\nthreshold = 0.0', "verdict.effect"),
        ('repeats = 4\nmetric = "hit"', "verdict.metric"),
        ("repeats = 4\nfloor = 0.6", "verdict.effect"),
        ("repeats = 4\nbogus = 1", "verdict.bogus"),
    ],
)
def test_a_malformed_statistical_verdict_names_its_field(
    scratch_root: Path, repeats: str, field: str
) -> None:
    write_repro(scratch_root, "x", GOOD.replace("REPEATS", repeats))
    with pytest.raises(SpecError) as caught:
        spec.load(scratch_root, "x")
    assert caught.value.field == field, caught.value


def test_a_statistical_verdict_loads(scratch_root: Path) -> None:
    write_repro(scratch_root, "x", GOOD.replace("REPEATS", 'repeats = "auto"\nbudget = 12'))
    repro = spec.load(scratch_root, "x")
    assert repro.verdict("broken").repeats == "auto" and repro.verdict("broken").budget == 12
    write_repro(scratch_root, "y", GOOD.replace("REPEATS", ""))
    assert spec.load(scratch_root, "y").verdict("broken").repeats is None  # one launch


def test_the_power_calculation_is_the_t_tests_own() -> None:
    """n with (t(1 - a/2, n-1) + t(1 - b, n-1)) sd / sqrt(n) <= effect, against the normal
    formula it tightens ((2.576 + 2.326) / 0.5)^2 = 96.1: a little more, never fewer."""
    n = stats.t_launches(1.0, 0.5, alpha=0.01, beta=0.01)
    assert 96 < n <= 102
    assert stats.t_launches(2.0, 0.5, alpha=0.01, beta=0.01) > 3.9 * n  # sd^2
    assert stats.t_launches(1.0, 0.0, alpha=0.01, beta=0.01) == stats.MAX_PLANNED
    assert 0.6 < stats.sd_lower(1.0, 4) < 0.7 and stats.sd_lower(1.0, 400) > 0.93


def _normal(section: VerdictSection, mean: float, sd: float, seed: int) -> Judgement:
    """The pipeline's loop (run/repeat_loop.py) on normal samples: launch to the next look,
    judge, stop once decided."""
    rng = random.Random(seed)
    judged: list[Judgement] = []
    while True:
        stop = repeat_verdict.next_look(section, len(judged))
        while len(judged) < stop:
            judged.append(_launch(Verdict.CLEAN, gap=rng.gauss(mean, sd)))
        out = _judge(section, judged)
        if repeat_verdict.decided(out) or len(judged) >= repeat_verdict.most(section):
            return out


EXAMPLE = VerdictSection(
    reproduced_if=[Rule(metric="gap", above=0.0)], repeats="auto", test="t", metric="gap",
    threshold=0.0, effect=0.5,
)  # fmt: skip


def test_the_documented_example_decides_a_half_sd_shift() -> None:
    """repros/README.md's example (auto, its default budget 200) on sd 1: right both ways;
    the old `repeats = 20` could not decide and says how many launches it would need."""
    assert repeat_verdict.most(EXAMPLE) == 200 and repeat_verdict.looks(EXAMPLE)[-2:] == [160, 200]
    for seed in range(8):
        assert _normal(EXAMPLE, 0.0, 1.0, seed).verdict is Verdict.CLEAN
        assert _normal(EXAMPLE, 0.5, 1.0, 100 + seed).verdict is Verdict.REPRODUCED
    twenty = _normal(EXAMPLE.model_copy(update={"repeats": 20}), 0.5, 1.0, 7)
    assert twenty.status is Status.UNDECIDED and twenty.stat is not None
    assert 40 < twenty.stat["needed"] < 400 and not twenty.stat["futile"]
    assert f"needs about {twenty.stat['needed']} launches" in twenty.reason
    assert "telling gap = 0 from 0.5 at alpha 0.01 a look and beta 0.01" in twenty.reason


def test_a_budget_that_cannot_decide_stops_early_and_says_what_it_needs() -> None:
    small = EXAMPLE.model_copy(update={"budget": 20})
    out = _normal(small, 0.5, 1.0, 3)  # about 140 launches needed at sd 1
    assert out.status is Status.UNDECIDED and out.verdict is None and repeat_verdict.decided(out)
    assert out.stat is not None and out.stat["futile"] and out.stat["n"] < 20
    assert "more than the 20 launches allowed; raise budget" in out.reason
    assert out.exit_code == ExitCode.UNDECIDED
    noisy = _normal(EXAMPLE, 0.0, 3.0, 5)  # sd 3: about 36x the launches
    assert noisy.status is Status.UNDECIDED and noisy.stat is not None and noisy.stat["n"] < 200


def test_list_shows_the_declared_test_per_variant(
    scratch_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reprobox.cli import main as cli_main

    declared = 'repeats = "auto"\ntest = "t"\nmetric = "gap"\nthreshold = 0.0\neffect = 0.5'
    toml = GOOD.replace("REPEATS", declared) + (
        '\n[variants.once]\nexpect = "clean"\n'
        'verdict = { reproduced_if = [{ metric = "hit", above = 0.5 }] }\n'
    )
    write_repro(scratch_root, "x", toml)
    assert cli_main.main(["list", "x"]) == 0
    out = capsys.readouterr().out
    assert (
        "      judged from repeated launches by a one-sample t-test of the mean of `gap`: "
        "reproduced when its 0.9986 interval lies above 0, clean when it lies below 0.5 "
        "(threshold 0, effect 0.5, alpha 0.01 over 7 looks, beta 0.01; up to 200 launches "
        '("auto": planned from the spread))'
    ) in out
    assert out.count("judged from repeated launches") == 1  # `once`: one launch, its rule
    assert cli_main.main(["list", "x", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["variants"]["broken"]["test"] == {
        "test": "t", "repeats": "auto", "most": 200, "alpha": 0.01, "beta": 0.01,
        "seed": None, "metric": "gap", "threshold": 0.0, "effect": 0.5,
    }  # fmt: skip
    assert found["variants"]["once"]["test"] is None and found["test"]["metric"] == "gap"
