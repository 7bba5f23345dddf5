"""The kl repro (trl#506): its verdict logic and API-generation choice as units, and the real
2-process accelerate + DeepSpeed ZeRO-2 runs end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import ROOT, newest_records, reprobox
from reprobox.core.errors import ExitCode

sys.path.insert(0, str(ROOT / "repros" / "kl"))
import ppo_step0
from common import CannotTest


def _rank(rank: int, diff: float, kl: float, probe: float) -> dict:
    return {
        "rank": rank, "max_abs_logp_diff": diff, "objective_kl_step0": kl,
        "local_kl_step0": kl, "forward_probe_max_abs_logp_diff": probe,
        "policy_dtype": "bfloat16", "ref_dtype": "float32" if probe else "bfloat16",
    }  # fmt: skip


def test_step0_verdict_from_per_rank_measurements() -> None:
    verdict, metrics, reason = ppo_step0.summarize(
        [_rank(0, 0.081, -0.0286, 0.09), _rank(1, 0.048, 0.0018, 0.08)]
    )
    assert verdict == "reproduced"
    assert metrics["max_abs_logp_diff"] == 0.081
    assert metrics["max_abs_kl_step0"] == 0.0286
    assert metrics["ranks_with_negative_kl_step0"] == 1
    assert "-0.028600 / +0.001800" in reason and "policy bfloat16 vs ref float32" in reason
    assert ppo_step0.summarize([_rank(0, 0.0, 0.0, 0.0), _rank(1, 0.0, 0.0, 0.0)])[0] == "clean"
    # below the 1e-6 threshold but a nonzero KL still reproduces (the issue's own stat)
    assert ppo_step0.summarize([_rank(0, 1e-7, 1e-9, 0.0)])[0] == "reproduced"


def test_forward_probe_criterion_ignores_generation_noise() -> None:
    """trl >= 0.12: generation-scored log-probs never equal the forward's, even when the
    models agree; the probe (same input, both models) decides instead."""
    noisy = [_rank(0, 0.059, -0.0027, 0.0), _rank(1, 0.059, -0.0027, 0.0)]
    assert ppo_step0.summarize(noisy, "step0")[0] == "reproduced"
    assert ppo_step0.summarize(noisy, "forward-probe")[0] == "clean"
    split = [_rank(0, 0.049, -0.0005, 0.078), _rank(1, 0.049, -0.0005, 0.078)]
    assert ppo_step0.summarize(split, "forward-probe")[0] == "reproduced"


@pytest.mark.parametrize(
    ("version", "generation"),
    [((0, 4, 7), "old"), ((0, 7, 1), "old"), ((0, 11, 4), "old"), ((0, 12, 0), "trainer"),
     ((0, 25, 1), "trainer"), ((0, 26, 0), "experimental"), ((1, 12, 0), "experimental")],
)  # fmt: skip
def test_adapter_by_trl_generation(version: tuple, generation: str) -> None:
    assert ppo_step0.pick_generation(version, "auto") == generation


def test_trl_without_deepspeed_ppo_cannot_test() -> None:
    with pytest.raises(CannotTest, match="no DeepSpeed support"):
        ppo_step0.pick_generation((0, 4, 1), "auto")
    with pytest.raises(CannotTest, match="predates"):
        ppo_step0.pick_generation((0, 3, 0), "auto")


def test_exceptions_that_mean_cannot_test() -> None:
    assert "cannot import" in ppo_step0.classify_exception(ImportError("No module named 'x'"))
    assert "needs CUDA" in ppo_step0.classify_exception(RuntimeError("oneccl_bindings missing"))
    assert ppo_step0.classify_exception(ValueError("shapes differ")) is None


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


@pytest.mark.e2e
def test_default_variants_prove_the_bug_both_ways(results: Path) -> None:
    done = reprobox("run", "kl", timeout=3600)
    assert done.returncode == ExitCode.OK, done.stderr
    records = newest_records(results, "kl")
    assert set(records) == {"broken", "fixed", "workaround", "control_fp32"}
    broken = records["broken"]["result"]
    assert records["broken"]["verdict"] == "reproduced"
    assert broken["world_size"] == 2 and broken["backend"] == "gloo"
    assert broken["versions"]["trl"] == "0.7.1" and broken["versions"]["deepspeed"] == "0.19.8"
    assert {(r["policy_dtype"], r["ref_dtype"]) for r in broken["ranks"]} == {
        ("bfloat16", "float32")
    }
    assert broken["metrics"]["max_abs_logp_diff"] > 1e-6
    assert len(broken["series"]["kl_rank0"]) == len(broken["series"]["kl_rank1"]) >= 2
    for clean in ("fixed", "workaround", "control_fp32"):
        record = records[clean]
        assert record["verdict"] == "clean", clean
        assert record["metrics"]["max_abs_logp_diff"] == 0.0
        assert all(r["objective_kl_step0"] == 0.0 for r in record["result"]["ranks"])
    assert records["fixed"]["result"]["versions"]["trl"] == "0.7.2"
    assert (Path(records["broken"]["dir"]) / "rank1.log").is_file()


@pytest.mark.e2e
def test_versions_a_cpu_host_cannot_run_say_so(results: Path) -> None:
    done = reprobox("verdict", "kl", "--variant", "broken", "--with", "accelerate==0.28.0")
    assert done.returncode == 125, done.stderr
    assert "accelerate 0.28.0 hard-codes nccl/cuda" in done.stderr


@pytest.mark.e2e
def test_a_deepspeed_op_that_cannot_build_says_so(
    results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # nothing built yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))  # no C++ compiler
    done = reprobox("verdict", "kl", "--variant", "broken", timeout=1200)
    assert done.returncode == 125, done.stderr
    assert "DeepSpeed could not build its C++ op" in done.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_release_bisect_names_trl_0_7_2(results: Path) -> None:
    """The ground truth: trl 0.4.7 reproduces, 0.7.2 is the first clean release."""
    done = reprobox("bisect", "kl", "--good", "0.7.2", "--bad", "0.4.7", timeout=3600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "first clean release: trl 0.7.2"


@pytest.mark.e2e
@pytest.mark.slow
def test_newer_generations(results: Path) -> None:
    """trl 0.12 - 1.0 brought the bug back where bf16 comes from the accelerate config only;
    PPOConfig(bf16=True) avoids it, and trl >= 1.1 reads the accelerate config again."""
    variants = ["trl019_bf16_accelerate_only", "trl019_bf16_ppo_config",
                "trl112_bf16_accelerate_only"]  # fmt: skip
    done = reprobox("run", "kl", *(f"--variant={v}" for v in variants), timeout=3600)
    assert done.returncode == ExitCode.OK, done.stderr
    records = newest_records(results, "kl")
    assert records["trl019_bf16_accelerate_only"]["verdict"] == "reproduced"
    assert records["trl019_bf16_ppo_config"]["verdict"] == "clean"
    assert records["trl112_bf16_accelerate_only"]["verdict"] == "clean"
