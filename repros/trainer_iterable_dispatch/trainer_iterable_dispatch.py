"""From transformers 4.31.0, Trainer on 2 processes crashes on an IterableDataset of mixed lengths.

Reproduces huggingface/transformers#26548 ("Trainer errors out when concatenating different
sequence length batches with distributed training and IterableDataset"; the same root as
huggingface/transformers#24999, "dataloading bug after upgrading to 4.31.0"). transformers
4.31.0 builds the Trainer's dataloaders with `accelerator.prepare()`. For an
`IterableDataset` accelerate then defaults to `dispatch_batches=True`: process 0 reads one
batch per process, concatenates them into one tensor and sends each process its slice.
Batches padded per batch by the collator have different lengths, so the concatenation
raises `RuntimeError: Sizes of tensors must match except in dimension 0` on process 0 (the
other processes then lose their peer: gloo's "Connection closed by peer"). transformers
4.30.2 shards the stream per process (`IterableDatasetShard`) and pads nothing across
processes: it trains. The maintainers' answer is a workaround (`dispatch_batches=False`),
not a release that restores the default.

The check: a tiny BERT classifier built in code, a `torch.utils.data.IterableDataset` of 64
rows of 4 - 19 tokens, a collator that pads each batch to its longest row, `Trainer.train()`
for 4 steps of 4 rows a process. Metric `ranks_raising_concat_error`: processes whose
training raised the concatenation's RuntimeError (1 of 2 on 4.31.0: process 0; 0 of 2 when
it trains). A process whose peer crashed (gloo's connection closed or reset by peer) waits
for process 0's result and exits with its verdict; any other exception is an error, never a verdict.

Run it by hand with 2 processes (gloo on CPU):

    pip install torch "transformers==4.31.0" "accelerate==0.21.0" "numpy<2" "setuptools<81"
    torchrun --nproc_per_node 2 trainer_iterable_dispatch.py   # reproduces (exit 1)
    pip install "transformers==4.30.2"
    torchrun --nproc_per_node 2 trainer_iterable_dispatch.py   # clean (exit 0)

Exit code of every process: 0 clean, 1 reproduced, 3 error (after its traceback); torchrun
turns any nonzero worker code into 1. With REPRO_RESULT set, process 0 writes the result
JSON there. Standalone on purpose: it imports nothing from the harness that runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback

EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3  # neither a verdict nor cannot-test: `git bisect run` must not read it as one
SYMPTOM = "Sizes of tensors must match"  # torch.cat's message inside accelerate's concatenate
# gloo, on a process whose peer exited (either, depending on when it notices)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
WAIT_FOR_RESULT_S = 60.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    return parser.parse_args(argv)


def train(args) -> str:
    """'' when training ran; the RuntimeError's text when it raised one."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    rows, low, high = args.rows, 4, 20

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            generator = torch.Generator().manual_seed(0)
            for i in range(rows):
                length = int(torch.randint(low, high, (1,), generator=generator))
                ids = torch.randint(5, 100, (length,), generator=generator)
                yield {"input_ids": ids, "labels": i % 2}

    def collate(batch):
        ids = torch.nn.utils.rnn.pad_sequence([r["input_ids"] for r in batch], batch_first=True)
        return {"input_ids": ids, "labels": torch.tensor([r["labels"] for r in batch])}

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            out,
            per_device_train_batch_size=args.batch_size,
            max_steps=args.steps,
            report_to=[],
            no_cuda=True,
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=training, train_dataset=Stream(), data_collator=collate)
        try:
            trainer.train()
        except RuntimeError as error:
            return str(error)
    return ""


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "accelerate", "numpy"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def write_result(path, args, verdict, reason, metrics, started) -> None:
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": verdict,
        "reason": reason,
        "metrics": metrics,
        "versions": versions(),
        "device": "cpu",
        "backend": "gloo",
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "python": platform.python_version(),
        "wall_time_s": round(time.monotonic() - started, 3),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(tmp, path)


def verdict_of_rank0(path: str | None) -> int:
    """A process whose peer crashed exits with process 0's verdict, once it is written."""
    deadline = time.monotonic() + WAIT_FOR_RESULT_S
    while path and time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as handle:
                return EXIT[json.load(handle)["verdict"]]
        time.sleep(0.2)
    print("process 0 wrote no result after its crash", flush=True)
    return ERROR_EXIT


def main() -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    error = train(args)
    path = os.environ.get("REPRO_RESULT")
    if error and rank != 0 and any(gone in error for gone in PEER_GONE):
        print(f"[{args.variant}] rank {rank}: its peer crashed: {error[:120]}", flush=True)
        return verdict_of_rank0(path)
    if error and SYMPTOM not in error:
        raise RuntimeError(error)  # another failure: an error, never a verdict
    raised = 1.0 if error else 0.0
    verdict = "reproduced" if raised else "clean"
    reason = (
        f"rank {rank}: batch concatenation raised: {error[:160]}"
        if error
        else f"rank {rank} trained {args.steps} steps on {world} processes"
    )
    print(f"[{args.variant}] {verdict}: {reason}", flush=True)
    if rank == 0 and path:
        metrics = {"ranks_raising_concat_error": raised, "ranks_raising_concat_error_of": world}
        write_result(path, args, verdict, reason, metrics, started)
    return EXIT[verdict]


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(ERROR_EXIT)
    sys.stdout.flush()
    os._exit(code)  # no barrier: after a crash the process group is gone
