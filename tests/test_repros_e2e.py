"""Every repro proves itself: its default variants, run through the real CLI, each give the
verdict its repro.toml expects. Parametrized over `repros/*`, so adding a repro adds its test.

What a repro's default run shows beyond "every verdict as expected" (the mechanism's numbers:
lm_head's 4x, kl's dtype split) is checked here too, on the same run, so that no repro's
default variants run twice in the suite: the run is the session's shared one
(`default_runs`), which the pasted-comment and image tests read too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from shared_runs import SharedRun

from conftest import ROOT, newest_records
from reprobox.core.cells import default_cells
from reprobox.core.errors import ExitCode
from reprobox.core.spec import discover, load

PLATFORM = "cpu"  # what this suite's hosts run


def expected_cells(name: str) -> dict[str, tuple[str, set[str]]]:
    """label -> (expected verdict, verdicts accepted) of the repro's default cells here."""
    repro = load(ROOT, name)
    here = set(repro.variants_on(PLATFORM))
    cells = default_cells(repro, [v for v in repro.default_variants if v in here], PLATFORM)
    return {
        c.label: (c.expect.value, {c.expect.value, *(v.value for v in c.also_ok)}) for c in cells
    }


def lm_head_numbers(records: dict[str, dict]) -> None:
    """transformers#32272: lm_head ends at world_size x mean, and the report's own check
    (lm_head == wte after loading) cannot see it."""
    broken = records["broken"]["metrics"]
    assert broken["lm_head_over_mean"] == pytest.approx(4.0, rel=1e-5)  # world_size x mean
    assert broken["predicted_lm_head_factor"] == 4.0
    assert broken["loaded_lm_head_equals_wte"] == 1.0
    assert broken["loaded_wte_over_mean"] == pytest.approx(4.0, rel=1e-5)
    fixed = records["fixed"]["metrics"]
    assert fixed["lm_head_over_mean"] == pytest.approx(1.0, rel=1e-6)
    assert fixed["lm_head_excess_over_tolerance"] == 0
    assert fixed["loaded_lm_head_equals_wte"] == 1.0  # the fix keeps the tie
    assert records["untied"]["metrics"]["aliased_keys"] == 0
    result = records["broken"]["result"]
    assert result["world_size"] == 4 and result["backend"] == "gloo"
    assert result["versions"]["transformers"] == "4.32.1"
    assert len(result["ranks"]) == 4


def kl_numbers(records: dict[str, dict]) -> None:
    """trl#506: the bf16 policy against an fp32 reference at step 0, and exact zeros without it."""
    broken = records["broken"]["result"]
    assert broken["world_size"] == 2 and broken["backend"] == "gloo"
    assert broken["versions"]["trl"] == "0.7.1" and broken["versions"]["deepspeed"] == "0.19.8"
    assert {(r["policy_dtype"], r["ref_dtype"]) for r in broken["ranks"]} == {
        ("bfloat16", "float32")
    }
    assert broken["metrics"]["max_abs_logp_diff"] > 1e-6
    assert len(broken["series"]["kl_rank0"]) == len(broken["series"]["kl_rank1"]) >= 2
    for clean in ("fixed", "workaround", "control_fp32"):
        record = records[clean]
        assert record["metrics"]["max_abs_logp_diff"] == 0.0, clean
        assert all(r["objective_kl_step0"] == 0.0 for r in record["result"]["ranks"]), clean
    assert records["fixed"]["result"]["versions"]["trl"] == "0.7.2"
    assert (Path(records["broken"]["dir"]) / "rank1.log").is_file()


def shuffle_seed_numbers(records: dict[str, dict]) -> None:
    """accelerate#3398: every seed gives the unseeded generator's order on 2 processes only."""
    broken = records["broken"]["metrics"]
    assert (broken["same_order_pairs"], broken["same_order_pairs_of"]) == (3.0, 3.0)
    assert broken["matches_unseeded_generator"] == 1.0
    assert records["fixed"]["metrics"]["same_order_pairs"] == 0.0
    assert records["single_process"]["result"]["world_size"] == 1
    assert records["broken"]["result"]["versions"]["accelerate"] == "1.5.2"
    assert records["fixed"]["result"]["versions"]["accelerate"] == "1.6.0"


NUMBERS: dict[str, Callable[[dict[str, dict]], None]] = {
    "lm_head": lm_head_numbers,
    "kl": kl_numbers,
    "shuffle_seed": shuffle_seed_numbers,
}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in discover(ROOT) if not load(ROOT, n).corpus])
def test_default_variants_give_their_expected_verdicts(
    name: str, default_runs: Callable[[str], SharedRun]
) -> None:
    expected = expected_cells(name)
    assert expected, f"{name} has no default variant on {PLATFORM}"
    done = default_runs(name)  # `reprobox run NAME`, shared with the comment and image tests
    records = newest_records(done.results, name)
    assert set(records) == set(expected), done.stderr
    for label, (expect, accepted) in expected.items():
        record = records[label]
        shown = (label, record["status"], record["verdict"], record.get("reason"))
        assert record["status"] == "match", shown
        assert record["verdict"] in accepted, (*shown, expect)
    assert done.returncode == ExitCode.OK, done.stderr
    if name in NUMBERS:
        NUMBERS[name](records)
