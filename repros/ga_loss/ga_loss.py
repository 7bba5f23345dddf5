"""transformers 4.48.0 logs the training loss multiplied by the gradient accumulation steps.

Reproduces huggingface/transformers#35663. transformers 4.46 made the Trainer scale the loss
of models whose forward takes `**loss_kwargs` (Llama and most causal LMs) by the number of
items in the whole accumulated batch, so that gradient accumulation (GA) gives the same loss
and gradients as one big batch. huggingface/transformers#35438 (released in 4.48.0)
"inherited the typo in #34915" (its author, in #35663) in the condition that decides when
the Trainer still divides the loss by the GA steps itself: with GA=4 the `loss` it logs for
these models is 4x the true token mean. huggingface/transformers#35651 (released in 4.48.1)
fixed the condition. 4.47.0 shows the same 4x already (gone in 4.47.1): see
README.md for every release measured.

The check: the same 4 sequences of equal length (no padding, so the token mean is the same
either way), a tiny Llama built in code with a fixed seed, one optimizer step taken once as
`per_device_train_batch_size=4, gradient_accumulation_steps=1` and once as
`per_device_train_batch_size=1, gradient_accumulation_steps=4`. The first logged loss must
be the same; metric `logged_loss_ratio` is GA=4's over GA=1's (1.000 clean, 4.000 on 4.48.0),
and the verdict reads `logged_loss_ratio_error` = |ratio - 1| (reproduced above 0.05).

Run it by hand (one process, CPU, ~20 s):

    pip install torch "transformers==4.48.0" "accelerate==1.2.1" "numpy<2"
    python ga_loss.py            # reproduced (exit 1): ratio 4.000
    pip install "transformers==4.48.1"
    python ga_loss.py            # clean (exit 0): ratio 1.000

`--model NAME` builds the model from a hub config instead (random weights, still offline if
the config is cached). Exit code: 0 clean, 1 reproduced, 3 error (after its traceback). With
REPRO_RESULT set it writes the result JSON there. Standalone on purpose: it imports nothing
from the harness that runs it.
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
TOLERANCE = 0.05  # |ratio - 1| past this is the bug; float reordering gives < 1e-4


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--ga", type=int, default=4, help="gradient accumulation steps")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="", help="a hub config name instead of the tiny Llama")
    return parser.parse_args(argv)


def build_model(args):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    if args.model:
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def first_logged_loss(args, data, batch_size: int, ga: int) -> float:
    """One optimizer step over the same sequences; the loss the Trainer logs for it."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Keep(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    keep = Keep()
    model = build_model(args)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            out,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=ga,
            max_steps=1,
            logging_steps=1,
            learning_rate=1e-3,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
            data_seed=args.seed,
        )
        Trainer(model=model, args=training, train_dataset=data, callbacks=[keep]).train()
    if not keep.losses:
        raise RuntimeError("the Trainer logged no loss")
    return keep.losses[0]


def measure(args) -> dict:
    import torch

    vocab = 128
    generator = torch.Generator().manual_seed(args.seed)
    rows = torch.randint(0, vocab, (args.ga, args.seq_len), generator=generator)
    data = [{"input_ids": row, "labels": row} for row in rows]
    one_batch = first_logged_loss(args, data, batch_size=args.ga, ga=1)
    accumulated = first_logged_loss(args, data, batch_size=1, ga=args.ga)
    ratio = accumulated / one_batch
    error = abs(ratio - 1.0)
    metrics = {
        "logged_loss_ratio": ratio,
        "logged_loss_ratio_error": error,
        "loss_one_batch": one_batch,
        "loss_accumulated": accumulated,
        "gradient_accumulation_steps": float(args.ga),
    }
    reproduced = error > TOLERANCE
    reason = (
        f"logged loss with bs=1, GA={args.ga}: {accumulated:.4f}; with bs={args.ga}, GA=1: "
        f"{one_batch:.4f}; ratio {ratio:.3f}"
    )
    return {
        "verdict": "reproduced" if reproduced else "clean",
        "reason": reason,
        "metrics": metrics,
    }


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "accelerate", "numpy"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def write_result(path, args, outcome, started) -> None:
    if not path:
        return
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": outcome["verdict"],
        "reason": outcome["reason"],
        "metrics": outcome["metrics"],
        "details": {"seq_len": args.seq_len, "model": args.model or "tiny Llama (in code)"},
        "versions": versions(),
        "device": "cpu",
        "world_size": 1,
        "seed": args.seed,
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
    outcome = measure(args)
    write_result(os.environ.get("REPRO_RESULT"), args, outcome, started)
    print(f"[{args.variant}] {outcome['verdict']}: {outcome['reason']}", flush=True)
    return EXIT[outcome["verdict"]]


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(ERROR_EXIT)
    sys.exit(code)
