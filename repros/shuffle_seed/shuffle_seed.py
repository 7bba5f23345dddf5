"""With 2+ processes, accelerate shuffles a prepared DataLoader the same way whatever the seed.

Reproduces huggingface/accelerate#3398 ("Randomization with seed not working"). On more than
one process, `prepare_data_loader` makes the shuffle identical on every rank by giving the
sampler a generator and broadcasting rank 0's generator state at each epoch. When the user's
`DataLoader(shuffle=True)` has no generator of its own, accelerate 0.30.0 to 1.5.2 create one
with a bare `torch.Generator()` and never seed it (added by huggingface/accelerate#2694, the
rank-synchronisation fix of 0.30.0), so every run starts from torch's fixed default state:
`set_seed(0)`, `set_seed(1)`, ... all give the same sample order, epoch after epoch, and it is
the order an unseeded `torch.Generator()` gives. A single process is not affected (no
generator is made there). huggingface/accelerate#3459 (first released in 1.6.0) seeds the new
generator from torch's global RNG, which `set_seed` controls.

The check is the reporter's: `set_seed(s)`, `Accelerator()`, `DataLoader(range(10),
batch_size=1, shuffle=True)`, `accelerator.prepare(...)`, read the epochs, for several seeds;
the order each rank reads is gathered into the global order (rank r holds batches r, r+W, ...).
Reproduced when two different seeds give the same order (metric `same_order_pairs`, the
number of seed pairs that do, out of `same_order_pairs_of`; a clean accelerate gives 0 of 3,
the broken ones 3 of 3).

Run it by hand with 2 processes (gloo on CPU):

    pip install torch accelerate==1.5.2 "numpy<2"
    torchrun --nproc_per_node 2 shuffle_seed.py          # reproduces (exit 1)
    pip install accelerate==1.6.0
    torchrun --nproc_per_node 2 shuffle_seed.py          # clean (exit 0)

On one process (`python shuffle_seed.py`) it measures too, and is clean on the broken releases
as well: the control that the bug needs two or more. Where there is no GPU it asks for
`Accelerator(cpu=True)` (the reporter ran `Accelerator()` on GPUs): releases from 1.13 on set
up several CPU processes only when asked to, as `accelerate launch --cpu` does.

Exit code of every process: 0 clean, 1 reproduced, 125 cannot test here (only when accelerate
sets up another number of processes than were launched), 3 error (anything else, an accelerate
that fails to import included, after printing its traceback); torchrun itself turns any
nonzero worker code into 1. With REPRO_RESULT set, rank 0 writes the result JSON there.
Standalone on purpose: it imports nothing from the harness that runs it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
import traceback

EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3  # neither a verdict nor cannot-test: `git bisect run` must not read it as one


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for set_seed")
    parser.add_argument("--samples", type=int, default=10, help="dataset = range(samples)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if len(set(args.seeds)) < 2:
        parser.error("--seeds needs at least two different seeds")
    return args


def setup():
    """Import accelerate and build the Accelerator; (accelerator, None) or (None, reason).

    Only a measured mismatch (accelerate set up another number of processes than were
    launched) is "cannot test here"; an import or set-up failure raises, an error."""
    import accelerate
    import torch
    from accelerate import Accelerator

    # cpu=True where there is no GPU: releases from 1.13 on only set up several CPU
    # processes when asked to (what `accelerate launch --cpu` does).
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if accelerator.num_processes != int(os.environ.get("WORLD_SIZE", "1")):
        return None, (
            f"accelerate {accelerate.__version__} set up {accelerator.num_processes} process(es) "
            f"({accelerator.distributed_type}) for WORLD_SIZE={os.environ.get('WORLD_SIZE')}"
        )
    return accelerator, None


def read_epochs(accelerator, args, seed: int) -> list[list[int]]:
    """The reporter's loop at one seed: the global sample order of each epoch."""
    import torch
    import torch.distributed as dist
    from accelerate.utils import set_seed

    set_seed(seed)
    loader = torch.utils.data.DataLoader(
        range(args.samples), batch_size=args.batch_size, shuffle=True
    )
    loader = accelerator.prepare(loader)
    epochs = []
    for _ in range(args.epochs):
        mine = [[int(i) for i in batch.flatten().tolist()] for batch in loader]
        ranks = [mine]
        if accelerator.num_processes > 1:
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, mine)
        # Rank r holds batches r, r+W, r+2W, ... of the epoch: interleave them back.
        order = []
        for step in range(max(len(r) for r in ranks)):
            for per_rank in ranks:
                if step < len(per_rank):
                    order += per_rank[step]
        epochs.append(order)
    return epochs


def default_generator_order(args) -> list[int]:
    """The first epoch's order when the sampler's generator is a bare torch.Generator()."""
    import torch

    sampler = torch.utils.data.RandomSampler(range(args.samples), generator=torch.Generator())
    return [int(i) for i in sampler]


def measure(accelerator, args) -> dict:
    runs = {seed: read_epochs(accelerator, args, seed) for seed in args.seeds}
    rerun = read_epochs(accelerator, args, args.seeds[0])  # same seed again: reproducible?
    pairs = list(itertools.combinations(args.seeds, 2))
    same = [(a, b) for a, b in pairs if runs[a] == runs[b]]
    n = args.samples
    coverage_errors = sum(
        sorted(order[:n]) != list(range(n)) for epochs in runs.values() for order in epochs
    )
    distinct = len({json.dumps(epochs) for epochs in runs.values()})
    metrics = {
        "same_order_pairs": float(len(same)),  # seed pairs giving the same order ...
        "same_order_pairs_of": float(len(pairs)),  # ... of all pairs: "3 of 3"
        "distinct_orders": float(distinct),
        "distinct_orders_of": float(len(args.seeds)),  # one per seed when clean
        "seeds": float(len(args.seeds)),
        "same_seed_rerun_differs": float(rerun != runs[args.seeds[0]]),
        "matches_unseeded_generator": float(
            all(epochs[0][:n] == default_generator_order(args) for epochs in runs.values())
        ),
        "epoch_coverage_errors": float(coverage_errors),
    }
    reproduced = metrics["same_order_pairs"] > 0
    if reproduced:
        reason = (
            f"{len(same)} of {len(pairs)} seed pairs give the same order "
            f"({distinct} distinct order(s) over seeds {args.seeds}); first epoch: "
            f"{runs[args.seeds[0]][0]}"
        )
    else:
        reason = f"each of seeds {args.seeds} gives its own order"
    return {
        "verdict": "reproduced" if reproduced else "clean",
        "reason": reason,
        "metrics": metrics,
        "series": {
            f"order_seed{seed}": [i for order in epochs for i in order]
            for seed, epochs in runs.items()
        },
        "details": {
            "same_order_pairs": [list(p) for p in same],
            "distributed_type": str(accelerator.distributed_type),
        },
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
    dist.destroy_process_group()  # a forked worker can hang at exit without it


def main() -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:])
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    outcome = {"verdict": "cannot_test", "reason": "", "metrics": {}}
    device = "cpu"
    import torch.distributed as dist

    accelerator, why = setup()
    if accelerator is None:
        outcome["reason"] = why
    else:
        device = str(accelerator.device)
        outcome = measure(accelerator, args)
    if rank == 0:
        info = {"backend": backend(dist), "device": device, "world_size": world_size}
        write_result(os.environ.get("REPRO_RESULT"), args, outcome, info, started)
        print(f"[{args.variant}] {outcome['verdict']}: {outcome['reason']}", flush=True)
    if world_size > 1:
        meet_and_leave(dist)
    elif dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return EXIT[outcome["verdict"]]


def backend(dist) -> str:
    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return ""


def versions() -> dict:
    found = {}
    for name in ("torch", "accelerate", "numpy"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def write_result(path, args, outcome, info, started) -> None:
    if not path:
        return
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": outcome["verdict"],
        "reason": outcome["reason"],
        "metrics": outcome["metrics"],
        "series": outcome.get("series", {}),
        "details": {
            **outcome.get("details", {}),
            "samples": args.samples,
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "seeds": args.seeds,
        },
        "versions": versions(),
        **info,
        "seed": args.seeds[0],
        "python": platform.python_version(),
        "wall_time_s": round(time.monotonic() - started, 3),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(tmp, path)


def run() -> None:
    """main() on every rank; a failure prints its traceback (its last line says what failed)
    and exits ERROR_EXIT at once, without waiting on peers that may be stuck in a collective."""
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ERROR_EXIT)
    sys.exit(code)


if __name__ == "__main__":
    run()
