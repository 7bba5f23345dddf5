"""DeepSpeed 0.17.6 - 0.18.2: ZeRO-2 with gradient accumulation reports a smaller grad norm.

Reproduces deepspeedai/DeepSpeed#7718 ("Incorrect gradient computation in ZeRO-2 with
DeepSpeed >= 0.17.6"), reported from trl as huggingface/trl#4540: the same training under
ZeRO-2 logs a grad_norm 2-3x lower from DeepSpeed 0.17.6 on, while the loss stays equal to
3-4 decimals; ZeRO-3 is not affected; per the trl maintainers it is fixed in 0.18.3.

The check: a tiny MLP (16 -> 32 -> 1) under `deepspeed.initialize` with ZeRO stage 2,
`gradient_accumulation_steps=4`, a micro-batch of 4 per rank, Adam at lr 0 (the weights never
move, so every micro-step sees the same model) and no clipping, on 2 processes over gloo. After
one optimizer step (4 micro-steps) the engine's `get_global_grad_norm()` is compared with the
norm of the true gradient of the same objective, computed in plain torch from the same data on
every rank (the mean over ranks of the sum over micro-steps of grad(loss / 4)). The metric is
`grad_norm_rel_error = |engine / reference - 1|`: 0.0000 on 0.17.5 and 0.18.3, 0.4024 on
0.17.6 (ratio 0.5976 at seed 0; README.md). It is deterministic for a given seed (the data
and weights come from `--seed`, or `REPRO_SEED`), not noise: no statistical test is needed.
The loss of every micro-step is recorded too: it is equal on both sides, as in the report.

DeepSpeed on CPU: `DS_ACCELERATOR=cpu` (set here when CUDA is absent) and Adam with
`torch_adam: true` (no C++ optimizer op to build). At init DeepSpeed also JIT-builds a
shared-memory all-reduce op for CPU hosts (g++ and ninja, minutes); the releases this repro
covers only initialize it (ZeRO's collectives go through torch.distributed), so unless
`--shm-op` the script marks it unavailable before init and nothing is compiled.

Run it by hand with 2 processes (gloo on CPU):

    pip install torch==2.13.0 "numpy<2"
    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.17.6
    torchrun --nproc_per_node 2 ds_z2_gradnorm_0176.py      # reproduces (exit 1)
    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.18.3
    torchrun --nproc_per_node 2 ds_z2_gradnorm_0176.py      # clean (exit 0)

Exit code of every process: 0 clean, 1 reproduced, 125 cannot test here (DeepSpeed not
installed or not importable with this torch), 3 error (anything else, after printing its
traceback); torchrun turns any nonzero worker code into 1. With REPRO_RESULT set, rank 0
writes the result JSON there. Standalone on purpose: it imports nothing from the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3  # neither a verdict nor cannot-test
TOLERANCE = 0.01  # |engine / reference - 1| above this is the bug (fp32: 0 when right)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--stage", type=int, default=2, help="ZeRO stage")
    parser.add_argument("--ga", type=int, default=4, help="gradient_accumulation_steps")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision")
    parser.add_argument("--seed", type=int, default=None, help="default: REPRO_SEED, else 0")
    parser.add_argument(
        "--shm-op", action="store_true", help="let DeepSpeed JIT-build its CPU shm op"
    )
    return parser.parse_args(argv)


def import_deepspeed(shm_op: bool):
    """deepspeed, or (None, reason) when it cannot be imported here (cannot test)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as error:  # absent, or built against another torch
        return None, f"deepspeed cannot be imported here: {type(error).__name__}: {error}"
    if not shm_op:
        # The CPU accelerator's shared-memory all-reduce: initialized at init, not used by
        # ZeRO's training collectives; marking it unavailable skips its JIT build.
        compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
        if isinstance(compatible, dict):
            compatible["deepspeed_shm_comm"] = False
    return deepspeed, None


def build_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def batches(seed: int, rank: int, args) -> list:
    """Rank `rank`'s micro-batches for one optimizer step, the same on every process."""
    import torch

    out = []
    for step in range(args.ga):
        g = torch.Generator().manual_seed(seed * 100_003 + 1000 * rank + step)
        out.append(
            (
                torch.randn(args.micro_batch, 16, generator=g),
                torch.randn(args.micro_batch, 1, generator=g),
            )
        )
    return out


def reference_norm(seed: int, world: int, args) -> float:
    """The norm of the gradient DeepSpeed should report: the mean over ranks of the sum over
    micro-steps of grad(loss / ga), in plain torch, fp32."""
    import torch

    model = build_model(seed)
    for rank in range(world):
        for x, y in batches(seed, rank, args):
            ((model(x) - y).pow(2).mean() / args.ga / world).backward()
    return float(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])))


def measure(deepspeed, args, seed: int) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(seed)
    zero = {"stage": args.stage}
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.ga,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "Adam", "params": {"lr": 0.0, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
    }
    if args.bf16:
        config["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    losses = []
    for x, y in batches(seed, rank, args):
        x, y = x.to(engine.device), y.to(engine.device)
        if args.bf16:
            x, y = x.bfloat16(), y.bfloat16()
        loss = (engine(x) - y).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    engine_norm = float(engine.get_global_grad_norm())
    reference = reference_norm(seed, world, args)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "losses": losses})
    ratio = engine_norm / reference
    error = abs(ratio - 1.0)
    verdict = "reproduced" if error > TOLERANCE else "clean"
    mean_loss = sum(sum(r["losses"]) for r in gathered) / sum(len(r["losses"]) for r in gathered)
    return {
        "verdict": verdict,
        "reason": (
            f"ZeRO-{args.stage}, GA {args.ga}: get_global_grad_norm() {engine_norm:.6f}, the "
            f"true gradient's norm {reference:.6f} (ratio {ratio:.4f}); mean loss {mean_loss:.4f}"
        ),
        "metrics": {
            "grad_norm_rel_error": error,
            "grad_norm_ratio": ratio,
            "grad_norm_engine": engine_norm,
            "grad_norm_reference": reference,
            "mean_loss": mean_loss,
        },
        "ranks": [
            {"rank": r["rank"], **{f"loss_micro{i}": v for i, v in enumerate(r["losses"])}}
            for r in gathered
        ],
    }


def meet_and_leave(dist) -> None:
    """All ranks meet after rank 0 wrote its result, so no launcher kills it mid-write."""
    if not dist.is_available():
        return
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend="gloo", init_method="env://")
        except Exception:
            return
    dist.barrier()
    dist.destroy_process_group()


def write_result(result: dict) -> None:
    path = os.environ.get("REPRO_RESULT")
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=1)
    os.replace(tmp, path)  # atomic: never half-written


def main() -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:])
    seed = args.seed if args.seed is not None else int(os.environ.get("REPRO_SEED", "0"))
    rank = int(os.environ.get("RANK", "0"))
    import torch
    import torch.distributed as dist

    deepspeed, why = import_deepspeed(args.shm_op)
    if deepspeed is None:
        outcome = {"verdict": "cannot_test", "reason": why, "metrics": {}}
    else:
        deepspeed.init_distributed("gloo")
        outcome = measure(deepspeed, args, seed)
    result = {
        "schema": 1,
        "variant": args.variant,
        **outcome,
        "versions": {
            "torch": torch.__version__,
            "deepspeed": getattr(deepspeed, "__version__", None),
        },
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "device": "cpu" if not torch.cuda.is_available() else "cuda",
        "backend": "gloo",
        "seed": seed,
        "python": platform.python_version(),
        "wall_time_s": round(time.monotonic() - started, 2),
    }
    if rank == 0:
        write_result(result)
    print(f"[{args.variant}] rank {rank}: {outcome['verdict']}: {outcome['reason']}", flush=True)
    meet_and_leave(dist)
    return EXIT[outcome["verdict"]]


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        code = ERROR_EXIT
    sys.stdout.flush()
    os._exit(code)
