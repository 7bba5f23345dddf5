"""The machine under a run, as every record keeps it (run/machine.py) and the comment's
environment section shows it (report/machine_text.py). What this GPU-less machine cannot
show (GPUs, a driver, CUDA and NCCL pins, an AMX CPU) comes from fakes of what the kernel and
nvidia-smi print; the rest is read here for real."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from conftest import FIXTURES
from fakes import FakeBackend
from reprobox.core import spec
from reprobox.core.cells import make_cell
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.report.machine_text import machine_table
from reprobox.run import machine, pipeline

CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 fma f16c avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 fma f16c avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile
"""
SMI = "NVIDIA H100 80GB HBM3, 550.54.15\nNVIDIA H100 80GB HBM3, 550.54.15\n"
GPU_LOCK = """\
torch==2.5.1 \\
    --hash=sha256:aa
nvidia-cuda-runtime-cu12==12.4.127 \\
    --hash=sha256:bb
nvidia-nccl-cu12==2.21.5 ; platform_machine == 'x86_64' \\
    --hash=sha256:cc
# nvidia-nccl-cu11==1.0 a comment is no pin
"""


def _proc(tmp_path: Path, kernel: str = "5.4.0-150-generic") -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text(kernel + "\n")
    (proc / "cpuinfo").write_text(CPUINFO)
    return proc


def test_the_capture_of_a_gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_gpus", lambda: machine.gpu_facts(SMI))
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123")
    variables = {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_DEBUG_FILE": "/logs/hf_abcdefghijklmnopqrstuvwxyz0123.txt",  # a secret's value
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "4",  # not of the three families the record keeps
    }
    found = machine.capture(variables, GPU_LOCK, proc=_proc(tmp_path), shm=tmp_path)
    assert found["kernel"] == "5.4.0-150-generic"
    assert found["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"
    flags = "avx avx2 fma f16c avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile"
    assert found["cpu_flags"] == flags
    assert found["gpu"] == "2 x NVIDIA H100 80GB HBM3" and found["driver"] == "550.54.15"
    assert (found["cuda_runtime"], found["nccl"]) == ("12.4.127", "2.21.5")
    assert found["env NCCL_P2P_DISABLE"] == "1" and found["env CUDA_VISIBLE_DEVICES"] == "0,1"
    assert found["env TORCH_NCCL_BLOCKING_WAIT"] == "1"
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in found["env NCCL_DEBUG_FILE"]
    assert "env OMP_NUM_THREADS" not in found
    assert found["dev_shm"].endswith("GiB") or found["dev_shm"].endswith("MiB")


def test_the_capture_of_this_machine_is_real() -> None:
    """Read for real here: the kernel as uname says it, /dev/shm's size as statvfs gives it;
    no GPU, and a CPU lock pins no CUDA runtime."""
    found = machine.capture({}, "numpy==1.26.4 \\\n    --hash=sha256:aa\n")
    assert found["kernel"] == platform.release()
    stat = os.statvfs("/dev/shm")
    assert found["dev_shm"] == machine.size_text(stat.f_blocks * stat.f_frsize)
    assert "cuda_runtime" not in found and "nccl" not in found
    assert not any(key.startswith("env ") for key in found)


def test_nvidia_smi_output_of_mixed_and_missing_gpus() -> None:
    mixed = "NVIDIA A100-SXM4-80GB, 535.1\nNVIDIA H100, 550.2\nNVIDIA H100, 550.2\n"
    assert machine.gpu_facts(mixed) == {
        "gpu": "1 x NVIDIA A100-SXM4-80GB + 2 x NVIDIA H100", "driver": "535.1, 550.2"
    }  # fmt: skip
    assert machine.gpu_facts("") == {}  # nvidia-smi failed: no row, never a made-up one
    assert machine.gpu_facts("No devices were found\n") == {}


def test_every_record_holds_the_machine(tmp_path: Path) -> None:
    toy = spec.load_file(FIXTURES / "repros" / "toy" / "repro.toml", FIXTURES / "fixes")
    store = RecordStore(tmp_path / "results")
    settings = Settings.from_env({"REPROBOX_RESULTS": str(store.base)})
    backend = FakeBackend({"clean": ("clean", 0.0, [0, 0])})
    [record] = pipeline.run_cells(toy, [make_cell(toy, "clean")], backend, store, settings,
                                  pipeline.RunOptions(lock=Path(__file__)))  # fmt: skip
    assert record.machine["kernel"] == platform.release()
    assert "image" not in record.machine  # a venv-like back end: no image
    saved = Record.load(Path(record.dir) / "record.json")
    assert saved.machine == record.machine


def _record(label: str, **facts: str) -> Record:
    return Record(repro="kl", variant=label, label=label, expect="clean", status="match",
                  verdict="clean", machine=facts)  # fmt: skip


def test_the_comment_shows_shared_facts_once_and_differing_ones_by_cell() -> None:
    records = [
        _record("broken", kernel="5.4.0", cpu="Xeon 8480+", **{"env NCCL_P2P_DISABLE": "1"}),
        _record("fixed", kernel="5.15.0", cpu="Xeon 8480+", **{"env NCCL_P2P_DISABLE": "1"}),
        _record("old"),  # a record from before the field: left out, not "(not set)"
    ]
    table = machine_table(records)
    assert "| CPU | `Xeon 8480+` | all |" in table
    assert "| kernel | `5.4.0` | `broken` |" in table
    assert "| kernel | `5.15.0` | `fixed` |" in table
    assert "| `NCCL_P2P_DISABLE` | `1` | all |" in table
    assert "GPUs" not in table  # nobody recorded one: no row
    assert machine_table([_record("old")]) == ""
