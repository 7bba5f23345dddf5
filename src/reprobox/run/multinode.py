"""One node's part of a launch that spans nodes: the launcher's multi-node arguments and the
environment of the ranks the harness starts itself.

A multi-node plan is the single-node plan plus where it sits: `nodes` (N), this node's
`node_rank` (Slurm's SLURM_NODEID) and the rendezvous host and port on the job's first node.
`processes` stays ranks per node, so the world is N x processes:
- torchrun: --nnodes N --nproc_per_node P --node_rank K and a c10d rendezvous on the first
  host (the first node hosts its store: is_host=1 there, 0 elsewhere, so two "nodes" on one
  machine never race to bind it); global ranks are then assigned by the rendezvous;
- `accelerate launch`: --num_machines N --machine_rank K --main_process_ip HOST with
  --num_processes N x P (accelerate counts processes over all machines); with a DeepSpeed
  config also --deepspeed_multinode_launcher standard (Slurm started the nodes' tasks);
- the plain python launcher: P ranks per node with RANK = K x P + local rank, WORLD_SIZE =
  N x P, MASTER_ADDR/MASTER_PORT the first host's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Placed(Protocol):
    """What this module reads of a launch plan (`launcher.LaunchPlan`, which calls it): its
    ranks per node and where this node sits. Declared here so the plan imports this module
    and never the other way round."""

    @property
    def processes(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def node_rank(self) -> int: ...
    @property
    def master_addr(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def rdzv_id(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    @property
    def config(self) -> Path | None: ...


def world_size(plan: Placed) -> int:
    return plan.nodes * plan.processes


def torchrun_args(plan: Placed) -> list[str]:
    """torchrun's options for this node (underscore spellings: torch < 2.1 has no others)."""
    if plan.nodes == 1:
        return [
            *("--nnodes", "1", "--nproc_per_node", str(plan.processes)),
            *("--master_addr", "127.0.0.1", "--master_port", str(plan.port)),
        ]
    host = "1" if plan.node_rank == 0 else "0"
    # The join timeout is the launch's: a node that never joins ends it with the reason.
    conf = f"is_host={host},join_timeout={max(1, int(plan.timeout))}"
    return [
        *("--nnodes", str(plan.nodes), "--nproc_per_node", str(plan.processes)),
        *("--node_rank", str(plan.node_rank)),
        *("--rdzv_backend", "c10d", "--rdzv_endpoint", f"{plan.master_addr}:{plan.port}"),
        *("--rdzv_id", plan.rdzv_id or "reprobox", "--rdzv_conf", conf),
    ]


def accelerate_args(plan: Placed) -> list[str]:
    """`accelerate launch`'s options for this node's share of the world."""
    own = ["--num_processes", str(world_size(plan)), "--main_process_port", str(plan.port)]
    if plan.nodes == 1:
        return own
    # DeepSpeed under accelerate would start the other machines itself (pdsh, over ssh);
    # here Slurm has already started one task per node, so each runs torchrun's way.
    speed = ["--deepspeed_multinode_launcher", "standard"] if _deepspeed(plan) else []
    return [
        *own,
        *("--num_machines", str(plan.nodes), "--machine_rank", str(plan.node_rank)),
        *("--main_process_ip", plan.master_addr),
        *speed,
    ]


def _deepspeed(plan: Placed) -> bool:
    try:
        return plan.config is not None and "DEEPSPEED" in plan.config.read_text()
    except OSError:
        return False


def rank_env(plan: Placed, local: int) -> dict[str, str]:
    """The torch.distributed variables of one rank the harness starts on this node."""
    return {
        "RANK": str(plan.node_rank * plan.processes + local),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world_size(plan)),
        "LOCAL_WORLD_SIZE": str(plan.processes),
    }


def harness_ranks(launcher: str, processes: int, nodes: int) -> bool:
    """Whether the harness starts the ranks itself (their statuses are known exactly)."""
    return launcher == "python" and (processes > 1 or nodes > 1)


def layout(nodes: int, processes: int) -> str:
    """The layout as the record and messages name it: `2 nodes x 2 ranks per node`."""
    return f"{nodes} node{'s' if nodes != 1 else ''} x {processes} rank" + (
        "s per node" if processes != 1 else " per node"
    )
