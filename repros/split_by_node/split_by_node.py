"""datasets 4.8.0-4.8.2: split_dataset_by_node gives one rank every row of a one-shard dataset.

Reproduces huggingface/datasets#8079 ("StepExamplesIterable._iter_arrow drops samples for
non-zero ranks for single-sharded"). When an `IterableDataset` has fewer shards than ranks,
`split_dataset_by_node(ds, rank, world_size)` keeps every `world_size`-th example, starting at
`rank` (a step over the examples). datasets 4.8.0 gave that step an Arrow fast path that steps
over Arrow *batches* instead of rows: a one-shard dataset read as one Arrow batch goes whole
to rank 0 and rank 1 gets nothing. huggingface/datasets#8081 (released in 4.8.3) fixed it;
torchtitan pinned `datasets<4.8.0` meanwhile (pytorch/torchtitan#2631).

The check, on 2 real processes (gloo on CPU): every rank builds the same 8-row dataset
(`Dataset.from_dict(...).to_iterable_dataset(num_shards=1)`), takes its split with
`split_dataset_by_node(ds, rank=RANK, world_size=WORLD_SIZE)`, reads it, and the rows each
rank read are gathered on rank 0. Right: each rank reads 4 rows, every row read once. Metrics:
`rank_rows_off_even_share` (max over ranks of |rows read - 8/2|: 0 clean, 4 on 4.8.0) and
`rows_missing_or_repeated`; the verdict reads both.

Run it by hand:

    pip install torch "datasets==4.8.0"
    torchrun --nproc_per_node 2 split_by_node.py     # reproduced (exit 1): rows per rank [8, 0]
    pip install "datasets==4.8.3"
    torchrun --nproc_per_node 2 split_by_node.py     # clean (exit 0): [4, 4]

`--format numpy` (or `arrow`) reads it through `with_format(...)`; `--map-batch-size 1` first
maps it with 1-row batches (the issue's setting, which split correctly in our runs). Exit code
of every process: 0 clean, 1 reproduced, 3 error (after its traceback); torchrun turns any
nonzero worker code into 1. With REPRO_RESULT set, rank 0 writes the result JSON there.
Standalone on purpose: it imports nothing from the harness that runs it.
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--rows", type=int, default=8, help="rows of the one-shard dataset")
    parser.add_argument("--format", default="", choices=["", "numpy", "arrow"])
    parser.add_argument("--map-batch-size", type=int, default=0, help="map(batched=True) first")
    return parser.parse_args(argv)


def my_rows(args, rank: int, world_size: int) -> list[int]:
    """The rows this rank reads from its split of the one-shard dataset."""
    from datasets import Dataset
    from datasets.distributed import split_dataset_by_node

    ds = Dataset.from_dict({"i": list(range(args.rows))}).to_iterable_dataset(num_shards=1)
    if args.map_batch_size:
        ds = ds.map(lambda batch: batch, batched=True, batch_size=args.map_batch_size)
    if args.format:
        ds = ds.with_format(args.format)
    rows: list[int] = []
    for example in split_dataset_by_node(ds, rank=rank, world_size=world_size):
        value = example["i"]
        if hasattr(value, "to_pylist"):  # arrow format: a one-row column
            rows += [int(v) for v in value.to_pylist()]
        else:
            rows.append(int(value))
    return rows


def measure(args, per_rank: list[list[int]]) -> dict:
    world_size = len(per_rank)
    share = args.rows / world_size
    counts = [len(rows) for rows in per_rank]
    seen = sorted(i for rows in per_rank for i in rows)
    off_share = max(abs(n - share) for n in counts)
    missing = len(set(range(args.rows)) - set(seen))
    repeated = len(seen) - len(set(seen))
    metrics = {
        "rank_rows_off_even_share": float(off_share),
        "rows_missing_or_repeated": float(missing + repeated),
        "rows": float(args.rows),
        **{f"rows_rank{r}": float(n) for r, n in enumerate(counts)},
    }
    reproduced = off_share > 0 or missing + repeated > 0
    reason = f"rows read per rank {counts} of {args.rows} over {world_size} ranks"
    if missing or repeated:
        reason += f"; {missing} row(s) read by no rank, {repeated} read twice"
    return {
        "verdict": "reproduced" if reproduced else "clean",
        "reason": reason,
        "metrics": metrics,
        "ranks": [{"rank": r, "rows_read": float(n)} for r, n in enumerate(counts)],
        "details": {"rows_per_rank": per_rank},
    }


def versions() -> dict:
    found = {}
    for name in ("torch", "datasets", "pyarrow", "numpy"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def write_result(path, args, outcome, world_size: int, backend: str, started) -> None:
    if not path:
        return
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": outcome["verdict"],
        "reason": outcome["reason"],
        "metrics": outcome["metrics"],
        "ranks": outcome["ranks"],
        "details": {
            **outcome["details"],
            "format": args.format or "python",
            "map_batch_size": args.map_batch_size,
        },
        "versions": versions(),
        "device": "cpu",
        "backend": backend,
        "world_size": world_size,
        "python": platform.python_version(),
        "wall_time_s": round(time.monotonic() - started, 3),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(tmp, path)


def main() -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:])
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    mine = my_rows(args, rank, world_size)
    per_rank = [mine]
    backend = ""
    dist = None
    if world_size > 1:
        import torch.distributed as dist

        dist.init_process_group(backend="gloo", init_method="env://")
        backend = str(dist.get_backend())
        per_rank = [None] * world_size
        dist.all_gather_object(per_rank, mine)
    outcome = measure(args, per_rank)
    if rank == 0:
        write_result(os.environ.get("REPRO_RESULT"), args, outcome, world_size, backend, started)
        print(f"[{args.variant}] {outcome['verdict']}: {outcome['reason']}", flush=True)
    if dist is not None:
        dist.barrier()  # rank 0 has written its result: no launcher kills it mid-write
        dist.destroy_process_group()
    return EXIT[outcome["verdict"]]


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ERROR_EXIT)  # at once: a peer may be stuck in a collective
    sys.exit(code)
