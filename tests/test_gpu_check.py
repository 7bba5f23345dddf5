"""The prepared GPU check (`nox -s gpu_check`, `reprobox gpu-check`): on a host without a GPU it
stops at once with "no GPU" and a nonzero exit, never a pretend result; its plan fits the
budget; only records this check wrote are reported."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, reprobox
from reprobox.cli import gpu_check
from reprobox.core.records import Record, RecordStore


def _path_without_nvidia_smi(extra: Path | None = None) -> str:
    """PATH minus any folder holding nvidia-smi (so a GPU host runs this test as a CPU one)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "nvidia-smi").exists()]  # fmt: skip
    return os.pathsep.join([*([str(extra)] if extra else []), *dirs])


def test_nox_gpu_check_stops_at_once_with_no_gpu() -> None:
    nox = Path(sys.executable).parent / "nox"
    env = {**os.environ, "PATH": _path_without_nvidia_smi()}
    started = time.monotonic()
    done = subprocess.run([nox, "-s", "gpu_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    errors = [line for line in out.splitlines() if line.startswith("reprobox: error:")]
    assert len(errors) == 1 and "no GPU" in errors[0], out
    assert "exit code 125" in out and "Traceback" not in out, out
    assert took < 120, took  # nothing installed nor launched before the probe


def test_dry_run_prints_the_plan_and_says_no_gpu(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    (house / "deepspeed-0.19.8.tar.gz").write_bytes(b"x" * 1024)
    (house / "trl-0.7.1-py3-none-any.whl").write_bytes(b"x" * 2048)
    env = {"PATH": _path_without_nvidia_smi()}
    done = subprocess.run(
        [sys.executable, "-m", "reprobox", "gpu-check", "--dry-run", "--wheelhouse", str(house)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for cell in gpu_check.load_plan(ROOT):
        assert f"{cell.repro} {', '.join(cell.variants) or 'default variants'}: cap >=" in out, out
    assert "2 files" in out and "sdists deepspeed-0.19.8.tar.gz" in out, out
    assert "no GPU" in out and "would stop here" in out, out


def test_a_listed_gpu_that_the_host_torch_cannot_use_is_no_gpu(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # a driver that lists a GPU; the host Python has no CUDA torch
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 580.00, 143771 MiB'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    old = os.environ["PATH"]
    try:
        os.environ["PATH"] = _path_without_nvidia_smi(bin_dir)
        facts = gpu_check.probe_host(sys.executable)
    finally:
        os.environ["PATH"] = old
    assert facts.gpus == [{"name": "NVIDIA H200", "driver": "580.00", "memory": "143771 MiB"}]
    assert facts.problem.startswith("no GPU"), facts.problem


def test_the_caps_sum_under_the_budget() -> None:
    caps = [cell.cap(gpu_check.BUDGET_S) for cell in gpu_check.load_plan(ROOT)]
    assert gpu_check.BUDGET_S == 480 and sum(caps) + gpu_check.PROBE_S <= gpu_check.BUDGET_S
    assert all(cap >= 60 for cap in caps), caps
    gpu_check.check_plan(
        ROOT, gpu_check.load_plan(ROOT)
    )  # every planned variant exists and runs on platform gpu


def test_the_check_exit_reads_every_cell() -> None:
    def cell(exit_code: int, *records: str, may_not_test: bool = False) -> dict[str, object]:
        rows = [dict(zip(("status", "verdict"), r.split(":"), strict=True)) for r in records]
        return {"exit": exit_code, "records": rows, "may_not_test": may_not_test}

    lm_head_on_one_gpu = cell(1, "mismatch:cannot_test", "match:cannot_test", may_not_test=True)
    ok = [cell(0, "match:reproduced"), cell(0, "recorded:clean"), lm_head_on_one_gpu]
    assert gpu_check.check_exit(ok) == 0
    assert gpu_check.check_exit([cell(0, "match:clean"), cell(1, "mismatch:clean")]) == 1
    assert gpu_check.check_exit([cell(0, "match:clean"), cell(124)]) == 124
    kl_cannot_test = cell(125, "mismatch:cannot_test")  # kl must answer: not excused
    assert gpu_check.check_exit([kl_cannot_test]) == 1
    assert gpu_check.check_exit([cell(0)]) == 4  # exit 0 but no record: not a result
    assert gpu_check.check_exit([cell(3, "error:None")]) == 3  # the environment failed


def test_only_records_this_check_wrote_are_reported(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    for started, variant in (("2026-11-30T10:00:00Z", "fixed_1gpu"),
                             ("2026-12-01T12:00:05Z", "zero2_bf16_1gpu")):  # fmt: skip
        run_dir = store.new_run_dir("kl", f"{variant}-gpu")
        Record(repro="kl", variant=variant, label=variant, expect="reproduced",
               status="match", verdict="reproduced", platform="gpu", started_at=started,
               dir=str(run_dir), metrics={"max_abs_kl_step0": 0.01}).save()  # fmt: skip
    found = gpu_check.cell_results(
        "kl", ("zero2_bf16_1gpu", "fixed_1gpu"), "2026-12-01T12:00:00Z", tmp_path
    )
    assert [r["variant"] for r in found] == ["zero2_bf16_1gpu"]
    assert found[0]["metrics"] == {"max_abs_kl_step0": 0.01}


def test_a_budget_below_the_probe_is_bad_input() -> None:
    done = reprobox("gpu-check", "--dry-run", "--budget", "10", timeout=120)
    assert done.returncode == 2 and "--budget" in done.stderr, done.stderr


def test_a_cell_this_host_cannot_run_ends_cannot_test_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_nvidia_smi(), "REPROBOX_RESULTS": str(tmp_path)}
    cell = gpu_check.PlannedCell(repro="lm_head", share=1.0, why="4 ranks")
    code, _, log = gpu_check.run_cell(cell, 120, env, tmp_path)
    assert code in (1, 125), log.read_text()  # cannot-test: a mismatch where not also_ok
    assert "cannot test here" in gpu_check.last_error(log) and "GPU" in gpu_check.last_error(log)
    records = gpu_check.cell_results("lm_head", (), "2000-01-01T00:00:00Z", tmp_path)
    assert sorted(r["variant"] for r in records) == ["avg_op", "broken", "fixed", "untied"]
    assert all(r["verdict"] == "cannot_test" and "cannot test here" in r["reason"] for r in records)


def test_a_cell_past_its_cap_is_stopped_and_reads_as_a_timeout(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # one GPU listed: the cell gets past the count, to installing
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": _path_without_nvidia_smi(bin_dir)}
    env |= {"REPROBOX_RESULTS": str(tmp_path / "out"), "REPROBOX_CACHE": str(tmp_path / "c")}
    cell = gpu_check.PlannedCell(repro="kl", variants=("zero2_bf16_1gpu",), share=1.0, why="broken")
    code, wall, log = gpu_check.run_cell(cell, 3.0, env, tmp_path)
    said = log.read_text()
    assert code == 124 and wall < 3.0 + gpu_check.GRACE_S + 5, (wall, said)
    assert "cannot test" not in said and "terminated (SIGTERM)" in said, said


def test_time_a_cell_leaves_goes_to_the_cells_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path_without_nvidia_smi())
    plan = tuple(
        gpu_check.PlannedCell(repro="lm_head", share=0.5, why=n, may_not_test=True)
        for n in ("a", "b")
    )
    env = {**os.environ, "REPROBOX_RESULTS": str(tmp_path)}
    cells = gpu_check.run_plan(plan, time.monotonic() + 100, env, tmp_path, "2000", tmp_path)
    assert all(c["exit"] in (1, 125) for c in cells), cells  # 4 ranks, no GPU: at once
    assert 45 < cells[0]["cap_s"] <= 50 and cells[1]["cap_s"] > 80, cells
    assert gpu_check.check_exit(cells) == 0


STOPPED_CHILD = """
import sys
from pathlib import Path
from reprobox.cli import gpu_check
from reprobox.run import interrupts
cell = gpu_check.PlannedCell(repro="kl", variants=("zero2_bf16_1gpu",), share=1.0, why="x")
with interrupts.handled():
    try:
        gpu_check.run_cell(cell, 600, dict(__import__("os").environ), Path(sys.argv[1]))
    except KeyboardInterrupt:
        sys.exit(143)
"""


def test_a_check_terminated_mid_cell_leaves_no_process(tmp_path: Path) -> None:
    """SIGTERM to the check while a cell installs: the cell's run (its own session) is
    stopped too, and nothing of it is left."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": _path_without_nvidia_smi(bin_dir)}
    env |= {"REPROBOX_RESULTS": str(tmp_path / "out"), "REPROBOX_CACHE": str(tmp_path / "c")}
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_CHILD, str(tmp_path)], env=env)
    log = tmp_path / "kl-zero2_bf16_1gpu.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "c").exists():
        time.sleep(0.2)  # the run has started (its cache appears)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(tmp_path) in part for part in p.info["cmdline"] or []):
                left.append(p.info["cmdline"])
        except psutil.Error:
            pass
    assert not left, left
    assert log.is_file()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "is not a plan"),
        ('[[cell]]\nrepro = "kl"\nshare = 0.5\nwhy = "x"\n', "sum to 0.5, not 1"),
        ('[[cell]]\nrepro = "kl"\nshare = 1\nwhy = "x"\nsurprise = 1\n', "is not a plan"),
    ],
)
def test_a_plan_that_is_not_one_is_bad_input(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "repros").mkdir()
    (tmp_path / "repros" / "gpu_check.toml").write_text(text)
    with pytest.raises(gpu_check.BadInput, match=said):
        gpu_check.load_plan(tmp_path)


@pytest.mark.parametrize(
    ("plan", "said"),
    [
        ("gpu_check_containers.toml", "--backend container; GPUs: docker --gpus all, podman "
         "--device nvidia.com/gpu=all (CDI)"),
        ("gpu_check_pyxis.toml", "--backend slurm --gres gpu:1 --container-image "
         "nvcr.io#nvidia/pytorch:24.05-py3; GPUs: the job's --gres"),
    ],
)  # fmt: skip
def test_the_gpu_container_plans_are_prepared(plan: str, said: str) -> None:
    """GPU containers (docker's --gpus, podman's CDI, pyxis on Slurm) are cells of plans
    of their own; the dry run names each command and how it reaches the GPUs (no GPU here:
    the check itself stops at its probe, as the default plan does)."""
    cells = gpu_check.load_plan(ROOT, ROOT / "repros" / plan)
    gpu_check.check_plan(ROOT, cells)  # every variant exists and runs on gpu
    env = {"PATH": _path_without_nvidia_smi()}
    done = subprocess.run(
        [sys.executable, "-m", "reprobox", "gpu-check", "--dry-run", "--plan", f"repros/{plan}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env}, cwd=ROOT,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert said in out, out
    assert "would stop here" in out, out


def test_a_container_cell_runs_its_image_torch_not_the_host_one() -> None:
    [cell, _] = gpu_check.load_plan(ROOT, ROOT / "repros" / "gpu_check_containers.toml")
    argv = gpu_check.cell_argv(cell, 100.0)
    assert argv[:2] == ["run", "lm_head"] and argv[-2:] == ["--backend", "container"]
    assert set(gpu_check.HOST_TORCH_ENV) == {"REPROBOX_TORCH_SOURCE", "REPROBOX_HOST_PYTHON"}


def test_a_plan_with_an_unknown_backend_is_bad_input(tmp_path: Path) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text('[[cell]]\nrepro = "kl"\nshare = 1\nwhy = "x"\nbackend = "k8s"\n')
    with pytest.raises(gpu_check.BadInput, match="is not a plan"):
        gpu_check.load_plan(tmp_path, plan)
