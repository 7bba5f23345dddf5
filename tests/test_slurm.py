"""The Slurm back end against a real single-node cluster (scripts/slurm-cluster.sh: munged,
slurmctld and slurmd as root, one node, a `debug` partition), started once for the session
and stopped by pid. No fake sbatch. Where Slurm cannot be had (not root, no slurm-wlm),
the tests fail and say how to install it, unless REPROBOX_SKIP_SLURM=1 leaves them out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from slurm_fixture import errors as _errors
from slurm_fixture import left_behind as _left_behind
from slurm_fixture import queued as _queued
from slurm_fixture import running_cluster
from slurm_fixture import scontrol as _scontrol
from slurm_fixture import wait_for as _wait_for

from conftest import newest_records, reprobox
from reprobox.core.errors import ExitCode, LaunchError
from reprobox.core.judge import Launched
from reprobox.core.settings import Settings
from reprobox.run import launcher
from reprobox.run.backend import Case, LaunchRequest
from reprobox.run.backends import detached, heartbeat, slurm, slurmjob

# its module-scoped fixture is built once: all of it on one worker
pytestmark = pytest.mark.xdist_group("tests/test_slurm.py")

NODE = socket.gethostname().split(".")[0]


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running cluster for the session; SLURM_CONF points at it while the tests run."""
    where = tmp_path_factory.mktemp("slurm")
    with running_cluster(where, nodes=1):
        yield where
    for name in ("slurmd", "slurmctld", "munged"):
        assert f"{name} " not in (where / "pids").read_text() if (where / "pids").exists() else True


@pytest.fixture
def cluster(slurm_cluster: Path) -> Iterator[Path]:
    """The session's cluster, its node back to idle after each test; no job of ours left."""
    yield slurm_cluster
    _scontrol("update", f"nodename={NODE}", "state=resume")
    assert _queued() == [], "a test left jobs in the queue"


def _jobs(records: dict[str, dict]) -> dict[str, dict]:
    return {
        label: json.loads((Path(r["dir"]) / slurmjob.JOB_FILE).read_text())
        for label, r in records.items()
    }


# -- pure parts (no cluster) ---------------------------------------------------------------


def test_time_limits_follow_the_timeout_and_slurm_spellings() -> None:
    assert slurm.time_limit(8) == "2" and slurm.time_limit(300) == "6"
    assert [slurm.limit_seconds(t) for t in ("5", "1:30", "1:00:00", "1-2")] == [
        300.0, 90.0, 3600.0, 93600.0
    ]  # fmt: skip
    assert slurm.check_time("0:30") == "0:30"
    with pytest.raises(slurm.BadInput, match="not a Slurm time limit"):
        slurm.check_time("10m")
    found = slurmjob.fields("JobId=7 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:9 NodeList=n1")
    assert (found["JobState"], found["ExitCode"], found["NodeList"]) == ("NODE_FAIL", "0:9", "n1")


def test_gpus_are_the_jobs_not_the_login_hosts() -> None:
    assert [slurm.gres_gpus(g) for g in ("gpu", "gpu:2", "gpu:a100:4", "gpu:2,shard:1")] == [
        1, 2, 4, 2]  # fmt: skip
    asking = slurm.SlurmBackend(Settings.from_env())
    assert asking.venv.gpus == sys.maxsize  # no nvidia-smi on the submit host is asked
    argv = asking._options("5", Path("o"), Path("."), gpus=2)
    assert argv[argv.index("--gres") + 1] == "gpu:2"  # a GPU launch asks for what it needs
    assert "--gres" not in asking._options("5", Path("o"), Path("."), gpus=0)
    given = slurm.SlurmBackend(Settings.from_env(), gres="gpu:a100:1")
    assert given.venv.gpus == 1  # a shortfall against --gres is cannot-test, before sbatch
    argv = given._options("5", Path("o"), Path("."), gpus=2)
    assert argv[argv.index("--gres") + 1] == "gpu:a100:1"


def test_a_launch_plan_survives_the_trip_to_the_node(tmp_path: Path) -> None:
    plan = launcher.LaunchPlan(
        launcher="python", bin_dir=tmp_path / "bin", processes=2, script=tmp_path / "s.py",
        script_args=["--mode", "clean"], timeout=8.0, log_dir=tmp_path / "logs", cwd=tmp_path,
        env={"A": "1"}, launcher_args=["-u"], config=None, port=1234, registry=tmp_path / "runs",
    )  # fmt: skip
    detached.write_plan(plan, tmp_path / "plan.json")
    assert detached.read_plan(tmp_path / "plan.json") == plan


def test_no_sbatch_on_path_is_one_line_and_exit_5(toy_root: Path, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    done = subprocess.run(
        [sys.executable, "-m", "reprobox", "run", "toy", "--backend", "slurm"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == ExitCode.NO_ENGINE, done.stderr
    [line] = _errors(done.stderr)
    assert "sbatch, squeue, scontrol, scancel not found on PATH" in line
    assert not (toy_root / "results").exists()  # nothing ran
    done = reprobox("run", "toy", "--partition", "debug")
    assert done.returncode == ExitCode.BAD_INPUT
    assert "--partition goes with --backend slurm" in _errors(done.stderr)[0]


def test_array_task_ids_as_scontrol_writes_them() -> None:
    assert slurmjob.task_ids("3") == [3]
    assert slurmjob.task_ids("0-3%2") == [0, 1, 2, 3]
    assert slurmjob.task_ids("1,4-5") == [1, 4, 5]
    assert slurmjob.task_ids("") == [] and slurmjob.task_ids("N/A") == []


def _task(tmp_path: Path, index: int) -> slurmjob.Task:
    run_dir = tmp_path / f"run {index}"  # a space: the script must quote
    plan = launcher.LaunchPlan(
        launcher="python", bin_dir=tmp_path / "bin", processes=1, script=tmp_path / "s.py",
        script_args=[], timeout=8.0, log_dir=run_dir, cwd=run_dir,
    )  # fmt: skip
    request = LaunchRequest(None, None, (Case(None, (), run_dir),), 8.0)  # type: ignore[arg-type]
    return slurmjob.Task(plan, request, run_dir / detached.PLAN_NAME,
                       run_dir / detached.OUTCOME_NAME)  # fmt: skip


def test_the_array_script_runs_each_task_in_its_own_run_folder(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(slurmjob.array_script([_task(tmp_path, 0), _task(tmp_path, 1)]))
    stub = tmp_path / "bin"
    stub.mkdir()
    for index in (0, 1):
        (tmp_path / f"run {index}").mkdir()
    # The runner itself is this interpreter; a stand-in says where it ran and with what.
    text = script.read_text().replace(sys.executable, "echo")
    assert text.count("exec echo -m reprobox.run.backends.slurmjob") == 2
    ran = [subprocess.run(["sh", "-c", text], env={**os.environ, "SLURM_ARRAY_TASK_ID": i},
                          capture_output=True, text=True, cwd=tmp_path) for i in "012"]  # fmt: skip
    assert str(tmp_path / "run 1" / detached.PLAN_NAME) in ran[1].stdout
    assert ran[0].returncode == ran[1].returncode == 0
    assert ran[2].returncode == 2 and "no launch for array task 2" in ran[2].stderr


def test_pyxis_options_mount_the_shared_paths_at_the_same_paths(scratch_root: Path) -> None:
    settings = Settings.from_env()
    plain = slurm.SlurmBackend(settings)
    assert plain.container_options() == []
    backend = slurm.SlurmBackend(settings, container_image="nvcr.io#nvidia/pytorch:24.05-py3",
                                 container_mounts="/data:/data:ro")  # fmt: skip
    options = backend._options("5", scratch_root / "slurm-%j.out", scratch_root)
    image, mounts, home = options[-3:]
    assert image == "--container-image=nvcr.io#nvidia/pytorch:24.05-py3"
    assert home == "--no-container-mount-home"
    pairs = mounts.removeprefix("--container-mounts=").split(",")
    assert pairs[-1] == "/data:/data:ro"
    shared = [p.split(":")[0] for p in pairs[:-1]]
    assert all(p.split(":")[0] == p.split(":")[1] for p in pairs[:-1])
    assert str(scratch_root.resolve()) in shared  # the checkout holds results/ here
    assert any(Path(sys.prefix).resolve().is_relative_to(p) for p in shared)
    assert str((scratch_root / "results").resolve()) not in shared  # under the checkout
    with pytest.raises(slurm.BadInput, match="--container-mounts goes with --container-image"):
        slurm.SlurmBackend(settings, container_mounts="/data:/data")


def test_pyxis_refuses_a_harness_on_the_systems_python(
    scratch_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "base_prefix", "/usr")  # mounting it would cover the image's
    backend = slurm.SlurmBackend(Settings.from_env(), container_image="ubuntu:24.04")
    with pytest.raises(slurm.BadInput, match=r"runs on the system's Python \(/usr\)"):
        backend.container_options()


def _watched(tmp_path: Path) -> tuple[slurmjob.Watch, Path]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return slurmjob.Watch(run_dir / detached.OUTCOME_NAME, deadline_s=300.0), run_dir


def _beat(run_dir: Path, count: int) -> None:
    (run_dir / heartbeat.HEARTBEAT_NAME).write_text(f"{count}\n")


RUNNING = {"JobState": "RUNNING", "NodeList": "n7"}
FINISHED = {"returncode": 0, "codes": [0, 0], "wall_s": 3.0, "timed_out": False, "log": "x.log"}


def test_a_node_that_stops_beating_is_lost_not_timed_out(tmp_path: Path) -> None:
    watch, run_dir = _watched(tmp_path)
    assert watch.check({"JobState": "PENDING"}, now=0.0) is None
    _beat(run_dir, 1)
    assert watch.check(RUNNING, now=1.0) is None
    _beat(run_dir, 2)
    assert watch.check(RUNNING, now=20.0) is None  # beating: running, however long
    assert watch.check(RUNNING, now=20.0 + slurmjob.LOST_AFTER_S - 1) is None
    final = watch.check(RUNNING, now=21.0 + slurmjob.LOST_AFTER_S)
    assert final is not None and final["JobState"] == slurmjob.LOST
    assert final["lost"] == f"its launch's heartbeat stopped {slurmjob.LOST_AFTER_S + 1:.0f}s ago"
    never, _ = _watched(tmp_path / "never")
    assert never.check(RUNNING, now=0.0) is None
    final = never.check(RUNNING, now=301.0)  # past the deadline with no beat ever: lost
    assert final is not None and final["JobState"] == slurmjob.LOST
    beating, run_dir = _watched(tmp_path / "beating")
    _beat(run_dir, 1)
    beating.check(RUNNING, now=0.0)
    for second in range(10, 320, 10):
        _beat(run_dir, second)
        final = beating.check(RUNNING, now=float(second))
        if final is not None:
            break
    assert second == 310  # past the deadline while beating: the harness's own kill
    assert final is not None and (final["JobState"], final["harness_kill"]) == ("TIMEOUT", "1")


def test_a_finished_launch_slurm_has_not_ended_is_read_from_its_outcome(tmp_path: Path) -> None:
    watch, run_dir = _watched(tmp_path)
    _beat(run_dir, 1)
    completing = {**RUNNING, "JobState": "COMPLETING"}
    assert watch.check(completing, now=0.0) is None
    (run_dir / detached.OUTCOME_NAME).write_text(json.dumps(FINISHED))
    assert watch.check(completing, now=1.0) is None  # Slurm gets its moment
    final = watch.check(completing, now=2.0 + slurmjob.OUTCOME_GRACE_S)
    assert final is not None and final["JobState"] == "COMPLETING" and "outcome_first" in final
    plan = launcher.LaunchPlan(
        launcher="python", bin_dir=tmp_path, processes=2, script=tmp_path / "s.py",
        script_args=[], timeout=60.0, log_dir=run_dir, cwd=run_dir,
    )  # fmt: skip
    request = LaunchRequest(None, None, (Case(None, (), run_dir),), 60.0)  # type: ignore[arg-type]
    launched = slurmjob.read_back(plan, request, "12", final, "2", {})
    assert isinstance(launched, Launched) and [e.code for e in launched.exits] == [0, 0]
    job = json.loads((run_dir / slurmjob.JOB_FILE).read_text())
    assert job["state"] == "COMPLETING" and "outcome_first" in job
    # stopped on its node (SIGTERM), and Slurm never says why: an error naming the node
    (run_dir / detached.OUTCOME_NAME).write_text(json.dumps({"interrupted": 143}))
    stopped, _ = _watched(tmp_path)
    assert stopped.check(RUNNING, now=0.0) is None
    final = stopped.check(RUNNING, now=slurmjob.STOPPED_GRACE_S + 1)
    assert final is not None and final["JobState"] == slurmjob.LOST
    error = slurmjob.read_back(plan, request, "12", final, "2", {})
    assert isinstance(error, LaunchError) and error.exit_code == ExitCode.RUN_FAILED
    assert str(error).startswith("slurm job 12 lost its node n7: its launch was stopped there")
    assert "still lists it RUNNING; no verdict" in str(error)


# -- against the cluster -------------------------------------------------------------------


def test_a_cluster_without_pyxis_is_one_plain_error(cluster: Path, scratch_root: Path) -> None:
    backend = slurm.SlurmBackend(Settings.from_env(), container_image="ubuntu:24.04")
    with pytest.raises(slurm.SlurmError) as found:
        backend.check()  # before anything is built
    assert "needs the pyxis plugin" in str(found.value)
    assert found.value.exit_code == ExitCode.NO_ENGINE
    script = scratch_root / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    with pytest.raises(slurm.SlurmError, match="needs the pyxis plugin"):  # sbatch's refusal
        backend._submit([*backend._options("1", scratch_root / "o.out", scratch_root),
                         str(script)])  # fmt: skip
    assert _queued() == []


def test_container_image_on_a_cluster_without_pyxis_through_the_cli(
    cluster: Path, toy_root: Path
) -> None:
    done = reprobox("run", "toy", "--backend", "slurm", "--container-image", "ubuntu:24.04")
    assert done.returncode == ExitCode.NO_ENGINE, done.stderr
    [line] = _errors(done.stderr)
    assert "needs the pyxis plugin" in line
    assert not (toy_root / "results" / "toy").exists()  # refused before anything ran
    local = reprobox("run", "toy", "--container-image", "ubuntu:24.04")
    assert local.returncode == ExitCode.BAD_INPUT
    assert "--container-image goes with --backend slurm" in _errors(local.stderr)[0]


def test_an_array_that_sbatch_refuses(cluster: Path, toy_root: Path) -> None:
    done = reprobox("run", "toy", "--matrix", "--backend", "slurm", "--gres", "gpu:1")
    assert done.returncode == ExitCode.RUN_FAILED, done.stderr
    [line] = _errors(done.stderr)
    assert "cannot submit the job (sbatch): sbatch: error: Invalid generic resource" in line
    records = newest_records(toy_root / "results", "toy")
    assert len(records) == 4
    assert all(r["status"] == "error" and "Invalid generic resource" in r["reason"]
               for r in records.values())  # fmt: skip
    assert _queued() == []


@pytest.mark.parametrize("cells", [[], ["--matrix"]], ids=["one", "matrix"])
def test_a_partition_that_does_not_exist(cluster: Path, toy_root: Path, cells: list[str]) -> None:
    done = reprobox("run", "toy", *cells, "--backend", "slurm", "--partition", "nope")
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    [line] = _errors(done.stderr)
    assert "--partition nope: no such partition on this cluster (partitions: debug)" in line


@pytest.mark.e2e
def test_a_variant_with_a_preflight_runs_through_slurm(cluster: Path, toy_root: Path) -> None:
    """The preflight's own launch (its Slurm output in the run folder's preflight/) and then
    the launch: main gave 'ended FAILED (ExitCode 0:53)', as sbatch's output folder was
    never made."""
    done = reprobox("run", "toy", "--variant", "preflight_ok", "--variant", "early",
                    "--backend", "slurm")  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stderr
    records = newest_records(toy_root / "results", "toy")
    assert {k: r["verdict"] for k, r in records.items()} == {
        "preflight_ok": "clean", "early": "cannot_test"}  # fmt: skip
    assert list((Path(records["preflight_ok"]["dir"]) / "preflight").glob("slurm-*.out"))


@pytest.mark.e2e
def test_a_matrix_through_slurm_gives_the_local_answer(cluster: Path, toy_root: Path) -> None:
    on_slurm = reprobox("run", "toy", "--matrix", "--backend", "slurm", "--workers", "2")
    assert on_slurm.returncode == 0, on_slurm.stderr
    slurm_records = newest_records(toy_root / "results", "toy")
    assert {r["runner"] for r in slurm_records.values()} == {"slurm"}
    jobs = _jobs(slurm_records)
    assert all(j["state"] == "COMPLETED" and j["exit_code"] == "0:0" for j in jobs.values())
    # one array job: one job id, a task per cell, each read back from its own run folder
    [array] = {j["array_job"] for j in jobs.values()}
    assert sorted(j["job"] for j in jobs.values()) == [f"{array}_{i}" for i in range(4)]
    for label, job in jobs.items():
        assert (Path(slurm_records[label]["dir"]) / f"slurm-{job['job']}.out").is_file()
    local = reprobox("run", "toy", "--matrix")
    assert local.returncode == 0, local.stderr
    local_records = newest_records(toy_root / "results", "toy")
    assert {r["runner"] for r in local_records.values()} == {"venv"}
    assert {k: r["verdict"] for k, r in slurm_records.items()} == {
        k: r["verdict"] for k, r in local_records.items()
    }
    assert len(slurm_records) == 4


@pytest.mark.e2e
@pytest.mark.slow
def test_a_two_worker_bisect_through_slurm_gives_the_local_answer(
    cluster: Path, toy_root: Path
) -> None:
    on_slurm = reprobox("bisect", "toy", "--workers", "2", "--backend", "slurm",
                        "--log", str(toy_root / "slurm" / "probes.jsonl"))  # fmt: skip
    assert on_slurm.returncode == 0, on_slurm.stderr
    local = reprobox("bisect", "toy", "--log", str(toy_root / "local" / "probes.jsonl"))
    assert local.returncode == 0, local.stderr
    answer = on_slurm.stdout.strip().splitlines()[-1]
    assert answer.startswith("first reproducing release: numpy 1.26.0 (assuming one change")
    assert answer.split(";")[0] == local.stdout.strip().splitlines()[-1].split(";")[0]
    jobs = list((toy_root / "slurm" / "runs").glob("**/slurm.json"))
    assert len(jobs) >= 6  # the ends, the search, the confirmations: each its own job
    assert jobs and all(json.loads(j.read_text())["state"] == "COMPLETED" for j in jobs)


@pytest.mark.e2e
def test_a_node_that_goes_down_mid_job(cluster: Path, toy_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "toy", "--variant", "hang", "--timeout",
         "600", "--backend", "slurm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: any(" RUNNING" in j for j in _queued()), 120, "the job to run")
        _scontrol("update", f"nodename={NODE}", "state=down", "reason=reprobox-test")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.RUN_FAILED, err
    assert "went down (NODE_FAIL)" in _errors(err)[-1]
    [record] = newest_records(toy_root / "results", "toy").values()
    assert record["status"] == "error" and "NODE_FAIL" in record["reason"]
    _wait_for(lambda: _queued() == [], 60, "an empty queue")


@pytest.mark.e2e
def test_ctrl_c_with_jobs_queued_cancels_them_and_keeps_the_probes(
    cluster: Path, toy_root: Path
) -> None:
    log = toy_root / "probes.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "bisect", "toy", "--workers", "2", "--backend",
         "slurm", "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # both ends measured, then no node for what comes next: the next jobs wait queued
        _wait_for(lambda: log.is_file() and len(log.read_text().splitlines()) >= 3, 240,
                  "the ends to be measured")  # fmt: skip
        _scontrol("update", f"nodename={NODE}", "state=drain", "reason=reprobox-test")
        _wait_for(lambda: any(" PENDING" in j for j in _queued()), 120, "a queued job")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C at the terminal sends
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "interrupted" in _errors(err)[-1]
    assert _queued() == []  # nothing left queued or running
    kept = [json.loads(line) for line in log.read_text().splitlines()[1:]]
    assert len(kept) >= 2 and all(e.get("verdict") or e.get("skip") for e in kept)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_job_killed_at_its_time_limit(cluster: Path, toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "hang", "--timeout", "600", "--time", "1",
                    "--backend", "slurm", timeout=300)  # fmt: skip
    assert done.returncode == ExitCode.TIMEOUT, done.stderr
    assert "ran past its time limit (1); Slurm killed it" in _errors(done.stderr)[-1]
    [record] = newest_records(toy_root / "results", "toy").values()
    job = json.loads((Path(record["dir"]) / slurmjob.JOB_FILE).read_text())
    assert job["state"] == "TIMEOUT"
    assert _queued() == []


@pytest.mark.e2e
@pytest.mark.slow
def test_an_array_task_killed_at_its_time_limit(cluster: Path, toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "clean", "--variant", "hang", "--timeout", "600",
                    "--time", "1", "--workers", "2", "--backend", "slurm", timeout=300)  # fmt: skip
    assert done.returncode == ExitCode.TIMEOUT, done.stderr
    assert "ran past its time limit (1); Slurm killed it" in _errors(done.stderr)[-1]
    records = newest_records(toy_root / "results", "toy")
    jobs = _jobs(records)
    assert records["hang"]["status"] == "error" and records["hang"]["exit_code"] == 124
    assert jobs["hang"]["state"] == "TIMEOUT"
    assert records["clean"]["status"] == "match" and jobs["clean"]["state"] == "COMPLETED"
    assert jobs["clean"]["array_job"] == jobs["hang"]["array_job"]
    # the clean cell's record was written when its task ended, not after the slowest
    written = (Path(records["clean"]["dir"]) / "record.json").stat().st_mtime
    assert written < jobs["hang"]["read_at"] - 30
    assert _queued() == [] and _left_behind(toy_root) == []


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_mid_array_cancels_it_and_keeps_the_records(
    cluster: Path, toy_root: Path, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "toy", "--variant", "clean", "--variant",
         "hang", "--variant", "reproduced", "--timeout", "600", "--backend", "slurm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip

    def clean_recorded() -> bool:
        found = newest_records(toy_root / "results", "toy").get("clean")
        return found is not None and found["status"] == "match"

    try:  # one task at a time (--workers 1): clean ends, hang runs, reproduced waits
        _wait_for(clean_recorded, 180, "the first task's record")
        _wait_for(lambda: any(" RUNNING" in j for j in _queued()), 60, "the next task to run")
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # what Ctrl-C at the terminal sends
        else:
            proc.send_signal(sig)  # a cancelled CI job: the harness alone
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    want = ExitCode.INTERRUPTED if sig == signal.SIGINT else ExitCode.TERMINATED
    assert proc.returncode == want, err
    assert len(_errors(err)) == 1
    assert _queued() == []  # the array scancelled, nothing queued or running
    records = newest_records(toy_root / "results", "toy")
    assert records["clean"]["status"] == "match"  # kept
    for label in ("hang", "reproduced"):
        assert records[label]["status"] == "error" and records[label]["reason"] == "interrupted"
    _wait_for(lambda: _left_behind(toy_root) == [], 30, "no process left behind")


# -- node loss: slurmd killed mid-job ------------------------------------------------------

NAP = """
[variants.nap]
expect = "clean"
args = ["--mode", "clean"]
launch = { env = { TOY_NAP_S = "20" } }
default = false
"""


def _with_a_nap(toy_root: Path) -> None:
    """The toy with a variant that works for 20 s before its clean answer."""
    toy = toy_root / "repros" / "toy"
    (toy / "repro.toml").write_text((toy / "repro.toml").read_text() + NAP)
    script = (toy / "toy.py").read_text()
    parsed = "\nargs = parser.parse_args()\n"
    nap = 'time.sleep(float(os.environ.get("TOY_NAP_S", "0")))\n'
    (toy / "toy.py").write_text(script.replace(parsed, parsed + nap, 1))


def _slurmd_pid(cluster: Path) -> int:
    lines = [line.split() for line in (cluster / "pids").read_text().splitlines()]
    return int([pid for name, pid in lines if name == "slurmd"][-1])


def _restart_slurmd(cluster: Path) -> None:
    """Start slurmd again, its pid recorded where slurm-cluster.sh stop finds it."""
    proc = subprocess.Popen(
        ["slurmd", "-D", "-f", str(cluster / "slurm.conf")], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    with (cluster / "pids").open("a") as pids:
        pids.write(f"slurmd {proc.pid}\n")


def _running_job() -> str:
    [job] = [line.split()[0] for line in _queued() if " RUNNING" in line]
    return job


def _run_and_lose_slurmd(cluster: Path, toy_root: Path, variant: str, *, and_the_job: bool
                         ) -> tuple[subprocess.Popen[str], str, float]:  # fmt: skip
    """Start one cell on the cluster; once it runs and beats, kill -9 slurmd (and, for a
    node that dies whole, every process of the job); the harness's exit and how long after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "toy", "--variant", variant, "--timeout",
         "600", "--backend", "slurm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: any(" RUNNING" in j for j in _queued()), 300, "the job to run")
        job = _running_job()
        beats = toy_root / "results" / "toy"
        _wait_for(lambda: list(beats.glob(f"*/*/{heartbeat.HEARTBEAT_NAME}")), 60, "a heartbeat")
        os.kill(_slurmd_pid(cluster), signal.SIGKILL)
        killed = time.monotonic()
        if and_the_job:  # the node's whole life: the job's slurmstepd, its runner, its ranks
            for found in psutil.process_iter(["pid", "cmdline"]):
                line = " ".join(found.info["cmdline"] or [])
                if f"[{job}." in line or str(toy_root) in line:
                    if found.pid != os.getpid():
                        found.kill()
        _, err = proc.communicate(timeout=180)
        return proc, err, time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        _restart_slurmd(cluster)
        _wait_for(lambda: _queued() == [], 120, "the node back and an empty queue")


@pytest.mark.e2e
def test_a_dead_slurmd_under_a_finished_launch_is_judged_from_its_outcome(
    cluster: Path, toy_root: Path
) -> None:
    """slurmd killed while the launch runs: the launch ends clean and writes its outcome;
    Slurm keeps the job listed. The answer is the launch's, within seconds, not a timeout."""
    _with_a_nap(toy_root)
    proc, err, took = _run_and_lose_slurmd(cluster, toy_root, "nap", and_the_job=False)
    assert proc.returncode == 0, err
    assert took < 20 + slurmjob.OUTCOME_GRACE_S + 30, took
    [record] = newest_records(toy_root / "results", "toy").values()
    assert (record["verdict"], record["status"], record["exit_code"]) == ("clean", "match", 0)
    job = json.loads((Path(record["dir"]) / slurmjob.JOB_FILE).read_text())
    assert "outcome_first" in job and job["state"] != "TIMEOUT", job


@pytest.mark.e2e
def test_a_node_that_dies_mid_launch_is_a_node_failure(cluster: Path, toy_root: Path) -> None:
    """slurmd and the job's processes killed (the node died whole): no outcome, the
    heartbeat stops, Slurm still says RUNNING. An error naming the node, never a timeout."""
    proc, err, took = _run_and_lose_slurmd(cluster, toy_root, "hang", and_the_job=True)
    assert proc.returncode == ExitCode.RUN_FAILED, err
    [line] = _errors(err)
    assert f"lost its node {NODE}: its launch's heartbeat stopped" in line, line
    assert "no verdict" in line and "time limit" not in line
    assert took < slurmjob.LOST_AFTER_S + 30, took
    [record] = newest_records(toy_root / "results", "toy").values()
    assert (record["status"], record["verdict"], record["exit_code"]) == ("error", None, 4)
    assert f"lost its node {NODE}" in record["reason"]
