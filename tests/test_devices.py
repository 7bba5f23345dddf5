"""Device counts: a launch that needs more GPUs than the host has is "cannot test here" (125)
with the reason, found before anything is installed; a platform may let ranks share GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import reprobox
from fakes import repro_toml, write_repro
from reprobox.core import spec
from reprobox.core.cells import make_cell
from reprobox.core.errors import ExitCode, ReproboxError, SpecError
from reprobox.core.records import RecordStore
from reprobox.core.settings import Settings
from reprobox.run import devices
from reprobox.run.backends.venv import VenvBackend
from reprobox.run.pipeline import RunOptions, exit_code, run_cells

GPU_REPRO = repro_toml(
    title="t",
    upstream="https://example.invalid/1",
    launcher="torchrun",
    processes=4,
    timeout=10,
    python=None,
    metric="m",
    variants={"broken": "reproduced", "solo": "reproduced"},
    variant_extra={"solo": "launch = { processes = 1 }\n"},
    extra="\n[platforms.gpu]\n",
)


def test_kl_needs_a_gpu_per_rank_and_its_1gpu_variant_one(root: Path) -> None:
    kl = spec.load(root, "kl")
    assert devices.gpus_needed(kl, "broken", "gpu") == 2
    assert devices.gpus_needed(kl, "zero2_bf16_1gpu", "gpu") == 1
    assert devices.gpus_needed(kl, "broken", "cpu") == 0
    assert devices.shortfall(kl, "zero2_bf16_1gpu", "gpu", 1) is None
    problem = devices.shortfall(kl, "broken", "gpu", 1)
    assert problem is not None
    assert "needs 2 GPUs" in problem and "has 1" in problem and "NCCL" in problem


def test_too_few_gpus_is_cannot_test_and_cpu_never_asks(root: Path) -> None:
    kl = spec.load(root, "kl")
    with pytest.raises(ReproboxError) as caught:
        devices.require(kl, "broken", "gpu", available=0)
    assert caught.value.exit_code == ExitCode.CANNOT_TEST
    assert str(caught.value).startswith("cannot test here: kl broken on platform gpu needs 2")
    devices.require(kl, "broken", "cpu", available=0)  # no GPU needed, none counted
    devices.require(kl, "broken", "gpu", available=2)


def test_gloo_shares_one_gpu_and_ranks_per_gpu_divides(scratch_root: Path) -> None:
    write_repro(
        scratch_root, "g", GPU_REPRO.replace("[platforms.gpu]", '[platforms.gpu]\nbackend = "gloo"')
    )
    gloo = spec.load(scratch_root, "g")
    assert devices.gpus_needed(gloo, "broken", "gpu") == 1
    assert devices.shortfall(gloo, "broken", "gpu", 0) is not None  # still one GPU
    shared = GPU_REPRO.replace(
        "[platforms.gpu]", '[platforms.gpu]\nbackend = "gloo"\nranks_per_gpu = 3'
    )
    write_repro(scratch_root, "g", shared)
    assert devices.gpus_needed(spec.load(scratch_root, "g"), "broken", "gpu") == 1
    write_repro(scratch_root, "g", GPU_REPRO)
    assert devices.gpus_needed(spec.load(scratch_root, "g"), "broken", "gpu") == 4
    assert devices.gpus_needed(spec.load(scratch_root, "g"), "solo", "gpu") == 1


def test_nccl_cannot_share_a_gpu(scratch_root: Path) -> None:
    write_repro(
        scratch_root,
        "g",
        GPU_REPRO.replace("[platforms.gpu]", "[platforms.gpu]\nranks_per_gpu = 2"),
    )
    with pytest.raises(SpecError, match=r"platforms.gpu.ranks_per_gpu.*NCCL refuses"):
        spec.load(scratch_root, "g")


def test_the_pipeline_records_125_before_installing(scratch_root: Path, tmp_path: Path) -> None:
    write_repro(scratch_root, "g", GPU_REPRO)
    repro = spec.load(scratch_root, "g")
    settings = Settings.from_env()
    store = RecordStore(settings.results)
    lock = tmp_path / "never-read.txt"  # the check comes first: nothing is resolved or installed
    cells = [make_cell(repro, "broken", platform="gpu"), make_cell(repro, "solo", platform="gpu")]
    records = run_cells(repro, cells, VenvBackend(settings, gpus=0), store, settings,
                        RunOptions(lock=lock))  # fmt: skip
    assert [r.exit_code for r in records] == [125, 125]
    assert "needs 4 GPUs for 4 ranks" in records[0].reason
    assert "needs 1 GPU for 1 rank;" in records[1].reason
    assert exit_code(records) == ExitCode.CANNOT_TEST
    assert all(r.env_s == 0.0 and not r.lock_hash for r in records)  # nothing was installed


def test_cli_says_cannot_test_on_a_host_without_enough_gpus() -> None:
    """Real: this host's own count (nvidia-smi -L, 0 without it) against kl's 2 ranks."""
    if devices.gpu_count() >= 2:
        pytest.skip("this host has 2 GPUs or more: kl broken would really run on them")
    done = reprobox("verdict", "kl", "--variant", "broken", "--platform", "gpu", timeout=120)
    assert done.returncode == 125, done.stderr
    assert "needs 2 GPUs for 2 ranks (NCCL takes one GPU per rank)" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
