"""A Slurm launch over N nodes: one task per node, each running its node's share of the plan
with the harness's own launcher, and the read-back of every node's outcome for the judge.

On the job's batch host (the first node of its allocation) `python -m
reprobox.run.backends.slurm_nodes batch PLAN` picks the rendezvous (the first node's
address, from `scontrol show hostnames` and its NodeAddr, and a port free there) and runs
(then writes down the exit status of, so a node whose task never started is known at once)
`srun --nodes N --ntasks N --ntasks-per-node 1 --kill-on-bad-exit=0 ... node PLAN`. Each task
then places the plan on its node (node rank = SLURM_NODEID, `run.multinode`) and runs it as
a single-node Slurm launch runs (the detached runner with a heartbeat), its logs, outcome
and heartbeat in the node's own folder: the run folder for node 0, `nodeK/` in it for node K.

Every node's outcome is read back: a node with no outcome is an error naming it, never a
verdict (its ranks' statuses are unknown); the ranks of all nodes go to the judge together,
so a rank that dies on the second node after rank 0 wrote "clean" is not clean.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprobox.core.errors import ExitCode, LaunchError, ReproboxError
from reprobox.core.files import atomic_write
from reprobox.core.judge import Launched
from reprobox.core.protocol import RankExit
from reprobox.run import launcher, multinode
from reprobox.run.backends import detached, heartbeat

MODULE = "reprobox.run.backends.slurm_nodes"  # run with -m: its __name__ is then __main__
RDZV_ENV = "REPROBOX_RENDEZVOUS"  # HOST:PORT on the first node, from the batch host to tasks
NODE_PLAN = "launch-plan-node.json"  # a node's own plan (its rank and the rendezvous)
SRUN_FILE = "launch-srun.json"  # srun's exit status, written on the batch host when it ends
NODE_NAME = "launch-node"  # the Slurm node a node folder's task ran on


def node_dir(run_dir: Path, node: int) -> Path:
    """Node `node`'s folder: its logs, outcome and heartbeat."""
    return run_dir if node == 0 else run_dir / f"node{node}"


def outcome_files(run_dir: Path, nodes: int) -> list[Path]:
    return [node_dir(run_dir, k) / detached.OUTCOME_NAME for k in range(nodes)]


def clear(run_dir: Path, nodes: int) -> None:
    """No outcome (and no srun status) left from an earlier launch in this run folder."""
    for path in [*outcome_files(run_dir, nodes), run_dir / SRUN_FILE]:
        path.unlink(missing_ok=True)


def node_name(outcome_file: Path, default: str) -> str:
    """The Slurm node a task ran on, as it wrote it down (else `default`)."""
    try:
        return (outcome_file.parent / NODE_NAME).read_text().strip() or default
    except OSError:
        return default


def nth_host(nodelist: str, node: int) -> str | None:
    """Node `node` of a job's node list (`n[1-2]`: SLURM_NODEID numbers them in this
    order), for naming a node whose task never wrote its name down."""
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                               text=True, timeout=30).stdout.split()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return names[node] if node < len(names) else None


def batch_argv(plan_file: Path) -> list[str]:
    """The batch script's command for a launch over nodes."""
    return [sys.executable, "-m", MODULE, "batch", str(plan_file)]


def sbatch_options(nodes: int) -> list[str]:
    """What the job asks Slurm for: N nodes, one task each."""
    return [f"--nodes={nodes}", "--ntasks-per-node=1"]


# -- the node side ---------------------------------------------------------------------------


def _first_node_address() -> str:
    """The first node of the job's node list, as an address its peers reach (NodeAddr: a
    node's name need not resolve)."""
    names = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    shown = subprocess.run(
        ["scontrol", "show", "node", "-o", names[0]], capture_output=True, text=True
    ).stdout
    for item in shown.split():
        if item.startswith("NodeAddr="):
            return item.split("=", 1)[1] or names[0]
    return names[0]


def batch(plan_file: Path) -> int:
    """On the batch host: choose the rendezvous, then become srun over every node."""
    plan = detached.read_plan(plan_file)
    try:
        host = _first_node_address()
    except (OSError, subprocess.CalledProcessError, IndexError, KeyError) as exc:
        print(f"reprobox: cannot read the job's first node: {exc}", file=sys.stderr)
        return int(ExitCode.RUN_FAILED)
    env = {**os.environ, RDZV_ENV: f"{host}:{launcher.free_port()}"}
    srun = shutil.which("srun") or "srun"
    argv = [
        srun,
        f"--nodes={plan.nodes}",
        f"--ntasks={plan.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",  # every node's status is read back, not only the first failure
        sys.executable, "-m", MODULE, "node", str(plan_file),
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"reprobox: cannot start srun: {exc}", file=sys.stderr)
        return int(ExitCode.RUN_FAILED)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # scancel: srun ends the step
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    code = proc.wait()
    data = {"returncode": code, "ended_at": time.time()}
    atomic_write(plan.log_dir / SRUN_FILE, json.dumps(data) + "\n")
    return code if code >= 0 else 128 - code


def srun_ended(run_dir: Path) -> int | None:
    """srun's exit status once it ended on the batch host (every task it started is gone)."""
    data = detached.read_outcome(run_dir / SRUN_FILE)
    return int(data["returncode"]) if data is not None and "returncode" in data else None


def node(plan_file: Path) -> int:
    """In one task: this node's share of the plan, run as a single-node launch is."""
    rank = int(os.environ["SLURM_NODEID"])
    host, _, port = os.environ[RDZV_ENV].rpartition(":")
    base = detached.read_plan(plan_file)
    where = node_dir(base.log_dir, rank)
    where.mkdir(parents=True, exist_ok=True)
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    (where / NODE_NAME).write_text(name + "\n")
    placed = replace(
        base, node_rank=rank, master_addr=host, port=int(port), log_dir=where,
        rdzv_id=os.environ.get("SLURM_JOB_ID", "reprobox"),
    )  # fmt: skip
    detached.write_plan(placed, where / NODE_PLAN)
    outcome = where / detached.OUTCOME_NAME
    outcome.unlink(missing_ok=True)
    harness = plan_file.with_name(heartbeat.HARNESS_NAME)  # one for every node of the launch
    beat = where / heartbeat.HEARTBEAT_NAME
    return heartbeat.run_with_heartbeat(where / NODE_PLAN, outcome, beat, harness)


# -- the submit side: every node's outcome, for the judge -------------------------------------


def launched(plan: launcher.LaunchPlan, run_dir: Path, job: str, where: str) -> Launched:
    """The launch over nodes as the judge reads it: every node's ranks, or an error naming a
    node that wrote no outcome (or whose runner failed)."""
    files = outcome_files(run_dir, plan.nodes)
    outcomes: list[dict[str, Any] | None] = [detached.read_outcome(path) for path in files]
    # The cause first: a node with no outcome, then one whose runner was stopped (srun or
    # Slurm ended the step: a peer that never started, say), then the nodes' own answers.
    for rank, data in enumerate(outcomes):
        if data is None or not ("returncode" in data or "error" in data or "interrupted" in data):
            raise LaunchError(
                f"slurm job {job}: {_who(files, rank)}"
                f" wrote no outcome: its task never started or died before the end; no "
                f"verdict{where}"
            )
    for rank, data in enumerate(outcomes):
        if data is not None and "interrupted" in data:
            raise LaunchError(
                f"slurm job {job}: {_who(files, rank)}"
                f" was stopped before its launch ended (its task got a signal: srun or Slurm "
                f"ended the step); no verdict{where}"
            )
    parts: list[tuple[int, Launched]] = []
    for rank, (path, data) in enumerate(zip(files, outcomes, strict=True)):
        assert data is not None
        name = node_name(path, "unnamed")
        node_plan = replace(plan, node_rank=rank, log_dir=path.parent)
        try:
            parts.append((rank, detached.launched(node_plan, data, run_dir)))
        except ReproboxError as exc:
            raise ReproboxError(f"slurm job {job}, node {rank} of {plan.nodes} ({name}): {exc}",
                                exit_code=exc.exit_code) from None  # fmt: skip
    return combine(plan, parts)


def _who(files: list[Path], rank: int) -> str:
    return f"node {rank} of {len(files)} ({node_name(files[rank], 'unnamed')})"


def combine(plan: launcher.LaunchPlan, parts: list[tuple[int, Launched]]) -> Launched:
    """One Launched of every node's: ranks the harness started get their global rank; a
    launcher's own status stays rank None (one per node)."""
    local = multinode.harness_ranks(plan.launcher, plan.processes, plan.nodes)
    exits: list[RankExit] = []
    for rank, part in parts:
        for item in part.exits:
            shift = rank * plan.processes if local and item.rank is not None else 0
            exits.append(RankExit(rank=None if item.rank is None else item.rank + shift,
                                  code=item.code))  # fmt: skip
    first = parts[0][1]
    errors = [p.last_error for _, p in parts if p.last_error]
    return replace(
        first,
        exits=() if any(p.timed_out for _, p in parts) else tuple(exits),
        timed_out=any(p.timed_out for _, p in parts),
        wall_s=max(p.wall_s for _, p in parts),
        last_error=errors[-1] if errors else "",
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("batch", "node"):
        print("usage: python -m reprobox.run.backends.slurm_nodes batch|node PLAN")
        return int(ExitCode.BAD_INPUT)
    return batch(Path(args[1])) if args[0] == "batch" else node(Path(args[1]))


if __name__ == "__main__":
    sys.exit(main())
