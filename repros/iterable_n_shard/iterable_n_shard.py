"""With 2+ processes, accelerate 1.8.0's prepare() crashes on a datasets.IterableDataset.

Reproduces huggingface/accelerate#3643 ("Typo in dataloader in newest version"). When a
`DataLoader` over a `datasets.IterableDataset` is prepared on more than one process without
`dispatch_batches` (and without `split_batches`), `prepare_data_loader` of accelerate 1.8.0
shards the dataset itself where it can (huggingface/accelerate#3635, "use
datasets.IterableDataset shard if possible"), guarded by `new_dataset.n_shard > num_processes`.
`datasets.IterableDataset` has `n_shards`, no `n_shard`: every rank raises
`AttributeError: 'IterableDataset' object has no attribute 'n_shard'` inside `prepare()`.
accelerate 1.7.0 never reads the attribute (it wraps the dataset in `IterableDatasetShard`);
huggingface/accelerate#3645 (first released in 1.8.1) spells it `n_shards`. One process is
not affected: the branch is only taken when `num_processes != 1`.

The check: `Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))`,
a `datasets.Dataset` of `--samples` rows turned into an `IterableDataset` of `--shards`
shards, `DataLoader(batch_size=--batch-size)`, `prepare()`, then one pass over it. The
symptom is the exception: a rank that raises the `AttributeError` naming `n_shard` counts
(metric `ranks_raising_n_shard`, out of `ranks_raising_n_shard_of`, the world size: 2 of 2
on 1.8.0, 0 of 2 on 1.7.0 and 1.8.1); any other exception is an error, never a verdict. A
clean rank also counts the rows it read (`samples_read` of `samples_read_of` over all ranks,
recorded, not judged).

Run it by hand with 2 processes (gloo on CPU):

    pip install torch accelerate==1.8.0 datasets==3.6.0
    torchrun --nproc_per_node 2 iterable_n_shard.py      # reproduces (exit 1)
    pip install accelerate==1.8.1
    torchrun --nproc_per_node 2 iterable_n_shard.py      # clean (exit 0)

`python iterable_n_shard.py` (one process) is clean on 1.8.0 too: the control that the bug
needs two or more. Where there is no GPU it asks for `Accelerator(cpu=True)`.

Exit code of every process: 0 clean, 1 reproduced, 125 cannot test here (only when
accelerate sets up another number of processes than were launched), 3 error (anything else,
an import failure or another exception included, after printing its traceback); torchrun
itself turns any nonzero worker code into 1. With REPRO_RESULT set, rank 0 writes the result
JSON there. Standalone on purpose: it imports nothing from the harness that runs it.
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
ERROR_EXIT = 3  # neither a verdict nor cannot-test: `git bisect run` must not read it as one
MISSING = "n_shard"  # the attribute 1.8.0 reads; datasets' is `n_shards`


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--samples", type=int, default=16, help="rows of the dataset")
    parser.add_argument("--shards", type=int, default=4, help="shards of the IterableDataset")
    parser.add_argument("--batch-size", type=int, default=2)
    return parser.parse_args(argv)


def setup():
    """The Accelerator the reporter's path needs; (accelerator, None) or (None, reason).

    Only a measured mismatch (accelerate set up another number of processes than were
    launched) is "cannot test here"; an import or set-up failure raises, an error."""
    import accelerate
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        dataloader_config=DataLoaderConfiguration(dispatch_batches=False),
    )
    if accelerator.num_processes != int(os.environ.get("WORLD_SIZE", "1")):
        return None, (
            f"accelerate {accelerate.__version__} set up {accelerator.num_processes} process(es) "
            f"({accelerator.distributed_type}) for WORLD_SIZE={os.environ.get('WORLD_SIZE')}"
        )
    return accelerator, None


def where(error: BaseException) -> str:
    """The innermost frame that raised, as `package/module.py:LINE` (no machine path)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    parts = last.filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{last.lineno}"


def symptom(error: AttributeError) -> dict | None:
    """The exception as the result records it when it is the bug's; None for any other."""
    if f"'{MISSING}'" not in str(error):
        return None
    return {"type": type(error).__name__, "message": str(error), "where": where(error)}


def this_rank(accelerator, args) -> dict:
    """Prepare the loader and read it once: what this rank saw.

    Only the AttributeError naming the missing attribute is the symptom; any other
    exception propagates (an error)."""
    import datasets
    import torch

    rows = datasets.Dataset.from_dict({"i": list(range(args.samples))})
    stream = rows.to_iterable_dataset(num_shards=args.shards).with_format("torch")
    loader = torch.utils.data.DataLoader(stream, batch_size=args.batch_size)
    try:
        prepared = accelerator.prepare(loader)
        seen = [int(i) for batch in prepared for i in batch["i"].flatten().tolist()]
    except AttributeError as error:
        found = symptom(error)
        if found is None:
            raise
        return {"raised": True, "exception": found, "seen": []}
    return {"raised": False, "exception": None, "seen": seen}


def summarize(ranks: list[dict], samples: int) -> dict:
    """The verdict, metrics and reason from every rank's outcome (rank 0 holds them all)."""
    raising = [r["rank"] for r in ranks if r["raised"]]
    read = [i for r in ranks for i in r["seen"]]
    metrics = {
        "ranks_raising_n_shard": float(len(raising)),
        "ranks_raising_n_shard_of": float(len(ranks)),
        "samples_read": float(len(read)),
        "samples_read_of": float(samples),
        "distinct_samples_read": float(len(set(read))),
    }
    if raising:
        first = next(r["exception"] for r in ranks if r["raised"])
        reason = (
            f"{first['type']}: {first['message']} (prepare() on rank(s) "
            f"{', '.join(map(str, raising))} of {len(ranks)}, at {first['where']})"
        )
    else:
        reason = (
            f"prepare() passed on {len(ranks)} rank(s); they read {len(read)} rows "
            f"({len(set(read))} distinct) of {samples}"
        )
    return {
        "verdict": "reproduced" if raising else "clean",
        "reason": reason,
        "metrics": metrics,
        "ranks": [
            {
                "rank": r["rank"],
                "raised_n_shard": float(r["raised"]),
                "samples": float(len(r["seen"])),
            }
            for r in ranks
        ],
        "details": {
            "exceptions": {str(r["rank"]): r["exception"] for r in ranks if r["raised"]},
            "rows_per_rank": {str(r["rank"]): r["seen"] for r in ranks},
        },
    }


def measure(accelerator, args) -> dict:
    import torch.distributed as dist

    mine = {"rank": accelerator.process_index, **this_rank(accelerator, args)}
    ranks = [mine]
    if accelerator.num_processes > 1:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    outcome = summarize(ranks, args.samples)
    outcome["details"]["distributed_type"] = str(accelerator.distributed_type)
    return outcome


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
    for name in ("torch", "accelerate", "datasets", "pyarrow", "numpy"):
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
        "ranks": outcome.get("ranks", []),
        "details": {
            **outcome.get("details", {}),
            "samples": args.samples,
            "shards": args.shards,
            "batch_size": args.batch_size,
        },
        "versions": versions(),
        **info,
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
