"""The kl repro (trl#506): its verdict logic, API-generation choice and cannot-test evidence as
units, and real 2-process accelerate + DeepSpeed ZeRO-2 runs end to end (its default variants
run in test_repros_e2e.py, with the numbers they must show)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, newest_records, reprobox
from reprobox.core.errors import ExitCode

sys.path.insert(0, str(ROOT / "repros" / "kl"))
import ppo_step0
from common import CannotTest, lacks


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


def _raised(exc: BaseException, filename: str = "<test>") -> BaseException:
    """`exc` raised for real by code compiled as `filename` (its traceback has that frame)."""
    try:
        exec(compile("raise exc", filename, "exec"), {"exc": exc})
    except BaseException as raised:
        return raised
    raise AssertionError("not raised")


def _import_error(statement: str) -> ImportError:
    try:
        exec(statement, {})
    except ImportError as exc:
        return exc
    raise AssertionError(f"{statement!r} imported")


def test_only_the_named_missing_modules_cannot_test() -> None:
    oneccl = _import_error("import oneccl_bindings_for_pytorch")
    assert "deepspeed < 0.14.1" in ppo_step0.classify_exception(oneccl)
    wrapped = _raised(RuntimeError("DeepSpeed accelerator init failed"))
    wrapped.__cause__ = oneccl  # found through the chain, as deepspeed re-raises it
    assert "deepspeed < 0.14.1" in ppo_step0.classify_exception(wrapped)
    fallback = _raised(RuntimeError("the fallback failed too"))
    fallback.__context__ = oneccl  # raised while handling it, not caused by it
    assert ppo_step0.classify_exception(fallback) is None
    # any other missing module, or a version set that does not import, is an error
    for broken in ("import no_such_module_for_kl", "from json import top_k_top_p_filtering"):
        assert ppo_step0.classify_exception(_import_error(broken)) is None, broken


def test_nccl_or_cuda_in_a_message_is_not_evidence() -> None:
    """Today's rule ("nccl" and "cuda" anywhere) would skip a real NCCL failure on a GPU host;
    the CPU host's versions that hard-code nccl are told apart by version in the preflight."""
    for text in ("NCCL error in: ProcessGroupNCCL.cpp, unhandled cuda error", "oneccl failed",
                 "Failed to import trl.trainer.ppo_trainer"):  # fmt: skip
        assert ppo_step0.classify_exception(RuntimeError(text)) is None, text


def test_a_build_failure_cannot_test_only_when_a_tool_is_missing() -> None:
    build = _raised(
        RuntimeError("Error building extension 'deepspeed_shm_comm': shm.cpp:12: error: ..."),
        "/env/lib/python3.11/site-packages/torch/utils/cpp_extension.py",
    )
    assert ppo_step0.classify_exception(build, missing_tools=[]) is None  # a real build error
    why = ppo_step0.classify_exception(build, missing_tools=["C++ compiler 'c++'", "ninja"])
    assert why.startswith("DeepSpeed could not build its C++ op: C++ compiler 'c++', ninja not")
    # a missing compiler does not make an unrelated failure a skip
    other = _raised(ValueError("shapes differ"), "/env/site-packages/trl/trainer/ppo_trainer.py")
    assert ppo_step0.classify_exception(other, missing_tools=["ninja"]) is None


def test_missing_build_tools_looks_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert ppo_step0.missing_build_tools() == ["C++ compiler 'c++'", "ninja"]
    for tool in ("c++", "ninja"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    assert ppo_step0.missing_build_tools() == []
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert ppo_step0.missing_build_tools() == [f"C++ compiler '{tmp_path}/no-such-c++' ($CXX)"]


def test_an_unreachable_hub_cannot_test_only_with_hub() -> None:
    offline = OSError("We couldn't connect to 'https://huggingface.co' to load this file")
    assert ppo_step0.classify_exception(offline) is None
    assert "needs the Hugging Face hub" in ppo_step0.classify_exception(offline, hub=True)


def test_a_trl_without_the_api_cannot_test_but_a_trl_that_breaks_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapters skip only when the import says the PPO API itself is absent."""
    assert lacks(_import_error("from json import PPOTrainer"), "json", ("PPOTrainer",))
    assert not lacks(_import_error("from json import PPOTrainer"), "json", ("PPOConfig",))
    gone = _import_error("from email.no_such_ppo import PPOTrainer")  # trl 1.13 dropped PPO
    assert lacks(gone, "email.no_such_ppo", ("PPOTrainer",))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "brokentrl").mkdir()
    (tmp_path / "brokentrl" / "__init__.py").write_text("from json import top_k_top_p_filtering\n")
    (tmp_path / "nodeptrl").mkdir()
    (tmp_path / "nodeptrl" / "__init__.py").write_text("import no_such_dependency_of_trl\n")
    for package in ("brokentrl", "nodeptrl"):
        broken = _import_error(f"from {package} import PPOTrainer")
        assert not lacks(broken, package, ("PPOTrainer",)), broken


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


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
    last = done.stdout.strip().splitlines()[-1]  # then what it assumed, how much it probed
    assert re.match(r"first clean release: trl 0\.7\.2(\s|$)", last), last


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
