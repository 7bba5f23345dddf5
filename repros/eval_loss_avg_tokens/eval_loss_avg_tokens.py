"""average_tokens_across_devices=True on N processes: Trainer.evaluate() reports N x eval_loss.

Reproduces huggingface/transformers#35078 ("Bug of eval loss when enabling
average_tokens_across_devices": "the loss value of eval will be always greater num_processes
times than the running of average_tokens_across_devices=false"). The option came with
huggingface/transformers#34373 (first released in 4.46.2) for training under gradient
accumulation: each process's loss is summed over its tokens and divided by
`num_items_in_batch`, the token count of the whole step gathered over every process, so
`Trainer.compute_loss` multiplies the loss by `accelerator.num_processes` to undo the
gradient averaging across processes. It multiplies at evaluation too, where
`prediction_step` passes no `num_items_in_batch` and the model returns each batch's plain
mean: every eval batch's loss, hence `eval_loss`, is num_processes x too large. The fix
multiplies only when `num_items_in_batch is not None` (first released in 4.49.0). A release
without the option (4.46.1 and older) cannot run this check: TrainingArguments rejects it.

The check, 2 processes over gloo on CPU, seconds: a tiny `LlamaForCausalLM` built in code
(fixed seed), 8 rows of 16 tokens (equal lengths, no padding, labels = input_ids), and
`Trainer.evaluate()` with `per_device_eval_batch_size=2`, once with the option on and once
with it off. The true eval loss is computed by hand on rank 0: the model's mean next-token
loss over all 8 rows at once (every batch has the same token count, so the mean of the batch
means is the token mean). Metric `eval_loss_ratio_error` = |eval_loss (option on) / true loss
- 1|: 0 when right, 1 on 2 processes where the bug is (ratio 2.000); reproduced above 0.01.
`eval_loss_off_ratio` (option off over the true loss) is recorded as the control: 1.000.

Run it by hand with 2 processes (gloo on CPU):

    pip install torch "transformers==4.46.2" "accelerate==1.2.1" "numpy<2"
    torchrun --nproc_per_node 2 eval_loss_avg_tokens.py   # reproduced (exit 1): ratio 2.000
    pip install "transformers==4.49.0"
    torchrun --nproc_per_node 2 eval_loss_avg_tokens.py   # clean (exit 0): ratio 1.000

On one process the option turns itself off (TrainingArguments warns), so the check needs 2+.
Exit code of every process: 0 clean, 1 reproduced, 125 cannot test (a transformers without
the option, or whose Trainer does not import with this torch: the reason is its last line),
3 error (anything else, after its traceback). With REPRO_RESULT set, process 0 writes the
result JSON there. Standalone on purpose: it imports nothing from the harness that runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback

EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3  # neither a verdict nor cannot-test: `git bisect run` must not read it as one
TOLERANCE = 0.01  # float summation order moves the ratio in the 6th digit at most
OPTION = "average_tokens_across_devices"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--rows", type=int, default=8, help="eval rows (all ranks together)")
    parser.add_argument("--batch-size", type=int, default=2, help="per_device_eval_batch_size")
    return parser.parse_args(argv)


def build_model():
    """The tiny causal LM, the same weights on every call and every rank."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def rows(count: int):
    import torch

    ids = torch.randint(0, 128, (count, 16), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def eval_loss(args, average: bool, work: str) -> float:
    """`eval_loss` of `Trainer.evaluate()` with the option on or off."""
    from transformers import Trainer, TrainingArguments

    training = TrainingArguments(
        work, per_device_eval_batch_size=args.batch_size, report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0, **{OPTION: average},
    )  # fmt: skip
    trainer = Trainer(model=build_model(), args=training, eval_dataset=rows(args.rows))
    return float(trainer.evaluate()["eval_loss"])


def true_loss(args) -> float:
    """The model's mean next-token loss over every eval row at once, by hand."""
    import torch

    ids = torch.stack([row["input_ids"] for row in rows(args.rows)])
    with torch.no_grad():
        return float(build_model()(input_ids=ids, labels=ids).loss)


def measure(args, work: str, world: int) -> dict:
    on = eval_loss(args, True, os.path.join(work, "on"))
    off = eval_loss(args, False, os.path.join(work, "off"))
    truth = true_loss(args)
    ratio, off_ratio = on / truth, off / truth
    error = abs(ratio - 1)
    verdict = "reproduced" if error > TOLERANCE else "clean"
    return {
        "verdict": verdict,
        "reason": (
            f"eval_loss on {world} processes with {OPTION}=True {on:.4f}, False {off:.4f}, "
            f"true mean token loss {truth:.4f} (ratio {ratio:.3f})"
        ),
        "metrics": {
            "eval_loss_ratio_error": error,
            "eval_loss_ratio": ratio,
            "eval_loss_off_ratio": off_ratio,
            "eval_loss_averaged_tokens": on,
            "eval_loss_option_off": off,
            "true_loss": truth,
        },
    }


def cannot_test(reason: str) -> dict:
    return {"verdict": "cannot_test", "reason": reason[:300], "metrics": {}}


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "accelerate"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def write_result(path, args, outcome, world, started) -> None:
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": outcome["verdict"],
        "reason": outcome["reason"],
        "metrics": outcome["metrics"],
        "details": {"rows": args.rows, "per_device_eval_batch_size": args.batch_size},
        "versions": versions(),
        "device": "cpu",
        "backend": "gloo",
        "world_size": world,
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
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        from transformers import Trainer, TrainingArguments  # noqa: F401
    except Exception as error:  # a release that does not import with this torch
        outcome = cannot_test(f"the Trainer does not import here: {type(error).__name__}: {error}")
    else:
        if OPTION not in TrainingArguments.__dataclass_fields__:
            import transformers

            outcome = cannot_test(
                f"transformers {transformers.__version__} has no TrainingArguments.{OPTION} "
                "(the option, and this bug, came in 4.46.2)"
            )
        elif world < 2:
            outcome = cannot_test(f"{world} process: {OPTION} needs 2+ (it turns itself off)")
        else:
            work = tempfile.mkdtemp(prefix="eval_loss_avg_tokens-")
            try:
                outcome = measure(args, work, world)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    path = os.environ.get("REPRO_RESULT")
    if rank == 0 and path:
        write_result(path, args, outcome, world, started)
    print(f"[{args.variant}] rank {rank}: {outcome['verdict']}: {outcome['reason']}", flush=True)
    import torch.distributed as dist

    if world > 1 and dist.is_available():
        if not dist.is_initialized():  # cannot test: no Trainer has joined the ranks yet
            dist.init_process_group("gloo")
        dist.barrier()  # rank 0 has written the result before any rank exits
    return EXIT[outcome["verdict"]]


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ERROR_EXIT)
    sys.exit(code)
