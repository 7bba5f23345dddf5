"""Launches over several nodes, against a real 2-node Slurm cluster on this machine
(scripts/slurm-cluster.sh with REPROBOX_SLURM_NODES=2: slurmd n1 and n2 at 127.0.0.1, one
partition), started for this module and stopped by pid. No fake sbatch or srun.
"""

from __future__ import annotations

import json
import os
import signal
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
from reprobox.core.errors import BadInput, ExitCode
from reprobox.run import launcher, multinode
from reprobox.run.backends import detached, heartbeat, slurm_nodes, slurmjob

# its module-scoped fixture is built once: all of it on one worker
pytestmark = pytest.mark.xdist_group("tests/test_multinode.py")

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 2-node cluster for this module; SLURM_CONF points at it while its tests run."""
    where = tmp_path_factory.mktemp("slurm2")
    with running_cluster(where, nodes=2):
        yield where
    assert not (where / "pids").exists()


@pytest.fixture
def cluster(two_nodes: Path) -> Iterator[Path]:
    """Both nodes back to idle after each test; no job of ours left."""
    yield two_nodes
    for node in NODES:
        _scontrol("update", f"nodename={node}", "state=resume")
    assert _queued() == [], "a test left jobs in the queue"


def _job(record: dict) -> dict:
    return json.loads((Path(record["dir"]) / slurmjob.JOB_FILE).read_text())


MORE = """
[variants.two_nodes]
expect = "clean"
args = ["--mode", "clean"]
launch = { nodes = 2 }
default = false

[variants.clean_torchrun]
expect = "clean"
args = ["--mode", "clean"]
launch = { launcher = "torchrun" }
default = false

[variants.late_exit]
expect = "clean"
args = ["--mode", "clean"]
launch = { env = { TOY_LATE_EXIT = "3" } }
default = false

[variants.nap]
expect = "clean"
args = ["--mode", "clean"]
launch = { env = { TOY_NAP_S = "25" } }
default = false
"""


@pytest.fixture
def toy(toy_root: Path) -> Path:
    """The toy with variants for nodes: [launch] nodes = 2, torchrun, a last rank that exits
    3 after rank 0 wrote its clean result, and one that works 25 s before its answer."""
    toy = toy_root / "repros" / "toy"
    (toy / "repro.toml").write_text((toy / "repro.toml").read_text() + MORE)
    script = (toy / "toy.py").read_text()
    parsed = "\nargs = parser.parse_args()\n"
    nap = 'time.sleep(float(os.environ.get("TOY_NAP_S", "0")))\n'
    script = script.replace(parsed, parsed + nap, 1)
    last = "dist.destroy_process_group()\n"
    late = (
        'if os.environ.get("TOY_LATE_EXIT") and rank == world - 1:\n'
        '    sys.exit(int(os.environ["TOY_LATE_EXIT"]))\n'
    )
    (toy / "toy.py").write_text(script.replace(last, last + late, 1))
    return toy_root


# -- pure parts (no cluster) -----------------------------------------------------------------


def _plan(tmp_path: Path, launcher_name: str, **where: object) -> launcher.LaunchPlan:
    return launcher.LaunchPlan(
        launcher=launcher_name, bin_dir=tmp_path / "bin", processes=2, script=tmp_path / "s.py",
        script_args=[], timeout=60.0, log_dir=tmp_path, cwd=tmp_path, port=29400,
        **where,  # type: ignore[arg-type]
    )  # fmt: skip


def test_each_launcher_gets_its_nodes_share(tmp_path: Path) -> None:
    placed = {"nodes": 2, "node_rank": 1, "master_addr": "10.0.0.7", "rdzv_id": "42"}
    argv = _plan(tmp_path, "torchrun", **placed).argv()
    text = " ".join(argv)
    assert "--nnodes 2 --nproc_per_node 2 --node_rank 1" in text
    assert "--rdzv_backend c10d --rdzv_endpoint 10.0.0.7:29400 --rdzv_id 42" in text
    assert "is_host=0,join_timeout=60" in text  # node 1 never hosts the store
    assert "--master_addr" not in argv
    single = " ".join(_plan(tmp_path, "torchrun").argv())
    assert "--nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29400" in single
    accel = " ".join(_plan(tmp_path, "accelerate", **placed).argv())
    assert "--num_processes 4 --main_process_port 29400 --num_machines 2" in accel
    assert "--machine_rank 1 --main_process_ip 10.0.0.7" in accel
    assert "--deepspeed_multinode_launcher" not in accel
    config = tmp_path / "zero2.yaml"
    config.write_text("distributed_type: DEEPSPEED\n")
    speed = _plan(tmp_path, "accelerate", config=config, **placed).argv()
    assert speed[speed.index("--deepspeed_multinode_launcher") + 1] == "standard"
    python = _plan(tmp_path, "python", **placed)
    assert multinode.rank_env(python, 1) == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}  # fmt: skip
    assert multinode.layout(2, 2) == "2 nodes x 2 ranks per node"


def test_a_plan_over_nodes_off_slurm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"nodes = 2 spans nodes: run it with --backend"):
        launcher.run(_plan(tmp_path, "python", nodes=2))


def _node_files(run_dir: Path, node: int, name: str) -> Path:
    where = slurm_nodes.node_dir(run_dir, node)
    where.mkdir(parents=True, exist_ok=True)
    (where / slurm_nodes.NODE_NAME).write_text(name + "\n")
    return where


def test_a_second_node_that_stops_beating_is_lost_by_name(tmp_path: Path) -> None:
    """Node 0 finished (its outcome written), node 1's beat stopped: node 1 is lost, named."""
    first, second = _node_files(tmp_path, 0, "n1"), _node_files(tmp_path, 1, "n2")
    watch = slurmjob.Watch(first / detached.OUTCOME_NAME, deadline_s=300.0, nodes=2)
    running = {"JobState": "RUNNING", "NodeList": "n[1-2]"}
    for path in (first, second):
        (path / heartbeat.HEARTBEAT_NAME).write_text("1\n")
    assert watch.check(running, now=0.0) is None
    done = {"returncode": 0, "codes": [0, 0], "wall_s": 3.0, "timed_out": False, "log": "x"}
    (first / detached.OUTCOME_NAME).write_text(json.dumps(done))
    assert watch.check(running, now=slurmjob.OUTCOME_GRACE_S + 5) is None  # node 1 still owes
    final = watch.check(running, now=slurmjob.LOST_AFTER_S + 1)
    assert final is not None and final["JobState"] == slurmjob.LOST
    assert final["NodeList"] == "n2" and "heartbeat stopped" in final["lost"]
    # both finished: read from the outcomes once Slurm has had its moment
    (second / detached.OUTCOME_NAME).write_text(json.dumps(done))
    both = slurmjob.Watch(first / detached.OUTCOME_NAME, deadline_s=300.0, nodes=2)
    assert both.check(running, now=0.0) is None
    final = both.check(running, now=slurmjob.OUTCOME_GRACE_S + 1)
    assert final is not None and "outcome_first" in final


def test_every_nodes_ranks_reach_the_judge_with_their_global_rank(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "python", nodes=2)
    for node, codes in ((0, [0, 0]), (1, [0, 3])):
        where = _node_files(tmp_path, node, f"n{node + 1}")
        outcome = {"returncode": max(codes), "codes": codes, "wall_s": 2.0 + node,
                   "timed_out": False, "log": str(where / "launch.log")}  # fmt: skip
        (where / detached.OUTCOME_NAME).write_text(json.dumps(outcome))
    launched = slurm_nodes.launched(plan, tmp_path, "7", "")
    assert [(e.rank, e.code) for e in launched.exits] == [(0, 0), (1, 0), (2, 0), (3, 3)]
    assert launched.wall_s == 3.0
    (slurm_nodes.node_dir(tmp_path, 1) / detached.OUTCOME_NAME).unlink()
    with pytest.raises(slurm_nodes.LaunchError, match=r"node 1 of 2 \(n2\) wrote no outcome"):
        slurm_nodes.launched(plan, tmp_path, "7", "")


# -- against the 2-node cluster --------------------------------------------------------------


@pytest.mark.e2e
def test_two_nodes_answer_as_one_node_does(cluster: Path, toy: Path) -> None:
    """--nodes 2 (a matrix as one array job, each task both nodes), [launch] nodes = 2, and
    torchrun over both nodes: every verdict the one-node answer, with a world of 4."""
    started = time.monotonic()
    one = reprobox("run", "toy", "--variant", "clean", "--variant", "reproduced",
                   "--backend", "slurm")  # fmt: skip
    one_s = time.monotonic() - started
    assert one.returncode == 0, one.stderr
    one_records = newest_records(toy / "results", "toy")
    started = time.monotonic()
    two = reprobox("run", "toy", "--variant", "clean", "--variant", "reproduced",
                   "--backend", "slurm", "--nodes", "2")  # fmt: skip
    two_s = time.monotonic() - started
    assert two.returncode == 0, two.stderr
    records = newest_records(toy / "results", "toy")
    for label in ("clean", "reproduced"):
        record, job = records[label], _job(records[label])
        assert record["verdict"] == one_records[label]["verdict"] == label
        assert record["runner"] == "slurm (2 nodes x 2 ranks per node)"
        assert job["layout"] == "2 nodes x 2 ranks per node" and job["nodes"] == list(NODES)
        assert [e["rank"] for e in record["exits"]] == [0, 1, 2, 3]
        result = json.loads((Path(record["dir"]) / "result.json").read_text())
        assert result["world_size"] == 4
        for where in job["node_logs"]:  # logs kept per node
            assert (Path(where) / "launch.log").is_file() and (Path(where) / "rank1.log").is_file()
    print(f"one node: {one_s:.1f}s, two nodes: {two_s:.1f}s (2 cells each)")
    spec = reprobox("run", "toy", "--variant", "two_nodes", "--variant", "clean_torchrun",
                    "--backend", "slurm", "--workers", "2")  # fmt: skip
    assert spec.returncode == 0, spec.stderr
    records = newest_records(toy / "results", "toy")
    assert _job(records["two_nodes"])["nodes"] == list(NODES)  # [launch] nodes = 2
    assert records["clean_torchrun"]["runner"] == "slurm"  # no --nodes: its own one node
    torch2 = reprobox("run", "toy", "--variant", "clean_torchrun", "--backend", "slurm",
                      "--nodes", "2")  # fmt: skip
    assert torch2.returncode == 0, torch2.stderr
    record = newest_records(toy / "results", "toy")["clean_torchrun"]
    assert record["verdict"] == "clean" and record["runner"].startswith("slurm (2 nodes")
    assert [e["rank"] for e in record["exits"]] == [None, None]  # each node's torchrun
    text = (Path(record["dir"]) / "node1" / "launch.log").read_text()
    assert "--nnodes 2 --nproc_per_node 2 --node_rank 1 --rdzv_backend c10d" in text
    assert _queued() == []


def test_nodes_off_slurm_is_one_line_and_exit_2(toy: Path) -> None:
    done = reprobox("run", "toy", "--variant", "two_nodes")
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert "[launch] nodes = 2 spans nodes: run it with --backend slurm" in _errors(done.stderr)[-1]
    done = reprobox("run", "toy", "--nodes", "2")
    assert done.returncode == ExitCode.BAD_INPUT
    assert _errors(done.stderr) == ["reprobox: error: --nodes goes with --backend slurm"]
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_a_rank_that_exits_on_the_second_node_after_the_result_is_not_clean(
    cluster: Path, toy: Path
) -> None:
    done = reprobox("run", "toy", "--variant", "late_exit", "--backend", "slurm", "--nodes", "2")
    assert done.returncode == ExitCode.RUN_FAILED, done.stderr
    [record] = newest_records(toy / "results", "toy").values()
    assert record["status"] == "error" and record["verdict"] is None
    assert record["reason"].startswith("rank 3 exited 3 but the result says clean"), record
    print(f"late exit on n2: {record['reason'][:120]}")
    result = json.loads((Path(record["dir"]) / "result.json").read_text())
    assert result["verdict"] == "clean"  # rank 0 wrote clean; the judge refused it
    assert _job(record)["state"] == "COMPLETED"  # Slurm saw nothing wrong either


def _node_processes(node: str) -> list[psutil.Process]:
    """What runs for a job on `node`: its tasks' processes (SLURMD_NODENAME in their
    environment), everything below them, and the slurmstepd above them."""
    found: dict[int, psutil.Process] = {}
    conf = os.environ["SLURM_CONF"]
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()  # this module's cluster's (another may name nodes n1, n2)
            if env.get("SLURMD_NODENAME") == node and env.get("SLURM_CONF") == conf:
                found[proc.pid] = proc
                for child in proc.children(recursive=True):  # ranks: the stack's env only
                    found[child.pid] = child
                parent = proc.parent()
                if parent is not None and parent.name().startswith("slurmstepd"):
                    found[parent.pid] = parent
        except psutil.Error:
            continue
    return list(found.values())


def _slurmd(cluster: Path, node: str) -> int:
    lines = [line.split() for line in (cluster / "pids").read_text().splitlines()]
    return int([pid for name, pid in lines if name == f"slurmd-{node}"][-1])


def _restart_slurmd(cluster: Path, node: str) -> None:
    proc = subprocess.Popen(
        ["slurmd", "-D", "-N", node, "-f", str(cluster / "slurm.conf")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    with (cluster / "pids").open("a") as pids:
        pids.write(f"slurmd-{node} {proc.pid}\n")


def _start(toy: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "toy", "--backend", "slurm", "--nodes", "2",
         "--timeout", "600", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _beating(toy: Path) -> bool:
    found = list((toy / "results" / "toy").glob(f"*/*/node1/{heartbeat.HEARTBEAT_NAME}"))
    return bool(found)


@pytest.mark.e2e
def test_a_second_node_that_dies_mid_launch_is_a_node_failure(cluster: Path, toy: Path) -> None:
    """n2's slurmd killed -9 with the job's processes there (the node died whole): an error
    naming n2, never a timeout and never a verdict."""
    proc = _start(toy, "--variant", "hang")
    try:
        _wait_for(lambda: _beating(toy), 180, "both nodes to beat")
        os.kill(_slurmd(cluster, "n2"), signal.SIGKILL)
        for found in _node_processes("n2"):
            found.kill()
        killed = time.monotonic()
        _, err = proc.communicate(timeout=180)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _restart_slurmd(cluster, "n2")
        _wait_for(lambda: _queued() == [], 180, "n2 back and an empty queue")
    assert proc.returncode == ExitCode.RUN_FAILED, err
    [line] = _errors(err)
    assert "n2" in line and "no verdict" in line, line
    assert "time limit" not in line and "timed out" not in line
    assert took < slurmjob.LOST_AFTER_S + 40, took
    print(f"node n2 killed: {line} ({took:.0f}s after the kill)")
    [record] = newest_records(toy / "results", "toy").values()
    assert (record["status"], record["verdict"], record["exit_code"]) == ("error", None, 4)
    _wait_for(lambda: _left_behind(toy) == [], 30, "no process left behind")


@pytest.mark.e2e
def test_scancel_from_outside_is_cancelled(cluster: Path, toy: Path) -> None:
    proc = _start(toy, "--variant", "hang")
    try:
        _wait_for(lambda: _beating(toy), 180, "both nodes to beat")
        [job] = [line.split()[0] for line in _queued() if " RUNNING" in line]
        subprocess.run(["scancel", job], check=True)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.RUN_FAILED, err
    assert "was cancelled outside reprobox" in _errors(err)[-1]
    print(f"scancel: {_errors(err)[-1]}")
    [record] = newest_records(toy / "results", "toy").values()
    assert record["status"] == "error" and record["verdict"] is None
    _wait_for(lambda: _queued() == [], 60, "an empty queue")
    _wait_for(lambda: _left_behind(toy) == [], 30, "no process left behind")


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_leaves_no_job_and_no_process_on_any_node(
    cluster: Path, toy: Path, sig: signal.Signals
) -> None:
    proc = _start(toy, "--variant", "hang")
    try:
        _wait_for(lambda: _beating(toy), 180, "both nodes to beat")
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
    assert len(_errors(err)) == 1 and "Traceback" not in err
    print(f"{sig.name}: exit {proc.returncode}: {_errors(err)[0][:120]}")
    assert _queued() == []
    _wait_for(lambda: _left_behind(toy) == [], 30, "no process left behind")
    assert _node_processes("n1") == [] and _node_processes("n2") == []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("nodes", ["2", "1"], ids=["probes-take-both-nodes", "a-node-a-probe"])
def test_a_two_worker_bisect_on_two_nodes_gives_the_local_answer(
    cluster: Path, toy: Path, nodes: str
) -> None:
    on_slurm = reprobox("bisect", "toy", "--workers", "2", "--backend", "slurm", "--nodes",
                        nodes, "--log", str(toy / "slurm" / "probes.jsonl"))  # fmt: skip
    assert on_slurm.returncode == 0, on_slurm.stderr
    local = reprobox("bisect", "toy", "--log", str(toy / "local" / "probes.jsonl"))
    assert local.returncode == 0, local.stderr
    answer = on_slurm.stdout.strip().splitlines()[-1]
    assert answer.startswith("first reproducing release: numpy 1.26.0 (assuming one change")
    assert answer.split(";")[0] == local.stdout.strip().splitlines()[-1].split(";")[0]
    jobs = [json.loads(j.read_text()) for j in (toy / "slurm" / "runs").glob("**/slurm.json")]
    assert len(jobs) >= 6 and all(j["state"] == "COMPLETED" for j in jobs)
    if nodes == "2":
        assert all(j["nodes"] == list(NODES) for j in jobs)
    else:
        # one node a probe (the scheduler may pack two probes onto one 2-CPU node)
        assert all(j["node"] in NODES and "nodes" not in j for j in jobs)
    assert _queued() == []


@pytest.mark.e2e
def test_a_rendezvous_whose_second_node_never_starts_ends_within_the_timeout(
    cluster: Path, toy: Path
) -> None:
    """n2's slurmd stopped (SIGSTOP) before the job: its task never starts, so torchrun on
    n1 waits in the rendezvous. srun gives up; the run ends within the launch timeout,
    naming n2 and why, with no verdict."""
    slurmd = psutil.Process(_slurmd(cluster, "n2"))
    slurmd.suspend()
    started = time.monotonic()
    try:
        done = reprobox("run", "toy", "--variant", "clean_torchrun", "--backend", "slurm",
                        "--nodes", "2", "--timeout", "50", timeout=300)  # fmt: skip
        took = time.monotonic() - started
    finally:
        slurmd.resume()
        _wait_for(lambda: _queued() == [], 180, "n2 back and an empty queue")
    assert done.returncode == ExitCode.RUN_FAILED, done.stderr
    [line] = _errors(done.stderr)
    assert "lost its node n2: its task never started and wrote no outcome" in line, line
    assert took < 50, took
    print(f"n2 never starts: {line} ({took:.0f}s, launch timeout 50s)")
    [record] = newest_records(toy / "results", "toy").values()
    assert record["status"] == "error" and record["verdict"] is None


@pytest.mark.e2e
def test_kill_9_of_the_harness_ends_the_job_on_every_node(cluster: Path, toy: Path) -> None:
    """The harness killed -9 mid-launch cannot scancel: the runners on both nodes see its
    heartbeat stop and stop their launch; no process of the job is left within
    HARNESS_LOST_AFTER_S + 2 * HEARTBEAT_S + TERM_GRACE_S (45 s), where the job used to run
    until its launch's own timeout (here 600 s)."""
    bound = heartbeat.HARNESS_LOST_AFTER_S + 2 * heartbeat.HEARTBEAT_S + launcher.TERM_GRACE_S
    proc = _start(toy, "--variant", "hang")
    try:
        _wait_for(lambda: _beating(toy), 180, "both nodes to beat")
        assert _node_processes("n1") and _node_processes("n2")
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()

        def nothing_left() -> bool:
            return not (_node_processes("n1") or _node_processes("n2") or _left_behind(toy))

        _wait_for(nothing_left, bound + 60, "no process of the job left")
        took = time.monotonic() - killed
        _wait_for(lambda: _queued() == [], 60, "an empty queue")
        emptied = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for line in _queued():
            subprocess.run(["scancel", line.split()[0]], check=False)
    print(f"kill -9 of the harness: no process left {took:.1f}s after, queue empty {emptied:.1f}s")
    assert took < bound + 5, took
    outcomes = sorted((toy / "results" / "toy").glob(f"*/*/{detached.OUTCOME_NAME}"))
    assert outcomes and "interrupted" in json.loads(outcomes[-1].read_text())
