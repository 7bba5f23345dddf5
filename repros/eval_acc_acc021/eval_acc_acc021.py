"""With accelerate 0.21.0, Trainer.evaluate() silently ignores eval_accumulation_steps.

Reproduces huggingface/transformers#25641 ("Eval Accumulation Steps Silently Fails w/
Accelerate >= 0.20.3?"). `eval_accumulation_steps=k` tells the Trainer to move the
predictions it gathers during evaluation to the CPU (numpy) every k steps, so that the
device holds at most k batches of logits. transformers 4.31.0 made that offload conditional
on `self.accelerator.sync_gradients` (huggingface/transformers#24756), a flag the training
loop leaves behind: with accelerate 0.20.3 the Trainer sets it True at every optimizer step
and accelerate sets it True at the end of each training dataloader, so evaluation starts
with it True. From accelerate 0.21.0 on, the Trainer hands the accumulation to accelerate
with `sync_with_dataloader=False` (an option 0.21.0 added) and only `accumulate()` sets the
flag, True on an optimizer step's micro-batch and False on the others. An epoch whose
micro-batches are not a multiple of `gradient_accumulation_steps` ends on a False, and the
evaluation that follows (`evaluation_strategy="epoch"`, or `evaluate()` after `train()`)
never offloads: every batch's logits stay on the device until the loop ends, the memory the
option exists to bound grows with the eval set, and nothing says so. The change that
triggers it is accelerate's, the symptom transformers' Trainer's; transformers 4.34.0
(huggingface/transformers#26060) offloads whenever accelerate is newer than 0.20.3. No
accelerate release restores the old behaviour.

The check: a tiny BERT classifier built in code (random weights, nothing downloaded),
trained for 2 epochs of `--train-rows` rows at batch size 1 with
`gradient_accumulation_steps=--ga` (6 micro-batches, GA 4: the first epoch ends 2
micro-batches past an optimizer step) and `evaluation_strategy="epoch"` over `--samples` eval
rows at `--batch-size` with `eval_accumulation_steps=--accumulation`. A callback counts the
prediction steps and a wrapper around `transformers.trainer.nested_numpify` (the offload's
device-to-host copy) notes how many batches were held on the device when each offload
came. Metric `max_batches_held`: the most batches held at once over both evaluations (at
most k when the option works; all 8 of an evaluation when it is ignored); the verdict reads
`batches_held_over_limit` = max(0, max_batches_held - k), reproduced above 0.
`sync_gradients_at_eval` records the flag as each evaluation began (recorded, not judged).

Run it by hand (one process, CPU, a few seconds):

    pip install torch "transformers==4.31.0" "accelerate==0.21.0" "numpy<2"
    python eval_acc_acc021.py      # reproduced (exit 1): 8 batches held, limit 2
    pip install "accelerate==0.20.3"
    python eval_acc_acc021.py      # clean (exit 0)

`--model NAME` builds the classifier from a hub config instead (random weights). Exit code:
0 clean, 1 reproduced, 125 cannot test (a transformers/accelerate pair that refuses to set up
a Trainer, with the reason), 3 error (anything else, after its traceback). With REPRO_RESULT
set it writes the result JSON there. Standalone on purpose: it imports nothing from the
harness that runs it.
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--samples", type=int, default=32, help="rows of the eval set")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2, help="eval_accumulation_steps")
    parser.add_argument("--train-rows", type=int, default=6, help="training rows an epoch")
    parser.add_argument("--ga", type=int, default=4, help="gradient_accumulation_steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="", help="a hub config name instead of the tiny BERT")
    return parser.parse_args(argv)


class Offloads:
    """Batches evaluated since the last device-to-host copy, and that count at each copy."""

    def __init__(self) -> None:
        self.held = 0
        self.steps = 0
        self.held_at_offload: list[int] = []

    def step(self) -> None:
        self.held += 1
        self.steps += 1

    def offload(self) -> None:
        if self.held:  # one offload copies several containers (losses, logits, labels)
            self.held_at_offload.append(self.held)
            self.held = 0


def build_model(args):
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        BertConfig,
        BertForSequenceClassification,
    )

    torch.manual_seed(args.seed)
    if args.model:
        config = AutoConfig.from_pretrained(args.model)
        return AutoModelForSequenceClassification.from_config(config)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertForSequenceClassification(config)


def trainer_or_reason(args, model, train, data, out, callback):
    """The Trainer, or the one-line reason this transformers/accelerate pair refuses to make one."""
    from transformers import Trainer, TrainingArguments

    try:
        training = TrainingArguments(
            out,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=args.ga,
            num_train_epochs=2,
            evaluation_strategy="epoch",
            save_strategy="no",
            learning_rate=1e-3,
            per_device_eval_batch_size=args.batch_size,
            eval_accumulation_steps=args.accumulation,
            report_to=[],
            no_cuda=True,
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = Trainer(
            model=model, args=training, train_dataset=train, eval_dataset=data, callbacks=[callback]
        )
        return trainer, ""
    except ImportError as error:  # "Using the `Trainer` with `PyTorch` requires accelerate>=..."
        return None, " ".join(str(error).split())


def measure(args) -> dict:
    import torch

    try:  # transformers 4.31 refuses an accelerate older than 0.20.3 when the Trainer imports
        import transformers.trainer as trainer_module
        from transformers import TrainerCallback
    except ImportError as error:
        return {"verdict": "cannot_test", "reason": " ".join(str(error).split()), "metrics": {}}

    offloads = Offloads()
    original = trainer_module.nested_numpify

    def counting(tensors):
        offloads.offload()
        return original(tensors)

    trainer_module.nested_numpify = counting

    flags: list[float] = []

    class CountSteps(TrainerCallback):
        def on_prediction_step(self, args, state, control, **kwargs):
            if offloads.steps % offloads_per_eval == 0:  # an evaluation's first step
                flags.append(float(trainer.accelerator.sync_gradients))
            offloads.step()

    generator = torch.Generator().manual_seed(args.seed)

    def rows(count: int) -> list[dict]:
        return [
            {"input_ids": torch.randint(5, 100, (16,), generator=generator), "labels": i % 2}
            for i in range(count)
        ]

    train, data = rows(args.train_rows), rows(args.samples)
    offloads_per_eval = -(-args.samples // args.batch_size)  # eval steps of one evaluation
    model = build_model(args)
    with tempfile.TemporaryDirectory() as out:
        trainer, reason = trainer_or_reason(args, model, train, data, out, CountSteps())
        if trainer is None:
            return {"verdict": "cannot_test", "reason": reason, "metrics": {}}
        trainer.train()
    if offloads.steps == 0 or not offloads.held_at_offload:
        raise RuntimeError(f"evaluation ran {offloads.steps} steps and offloaded nothing")
    most = max(offloads.held_at_offload)
    over = max(0, most - args.accumulation)
    metrics = {
        "batches_held_over_limit": float(over),
        "max_batches_held": float(most),
        "max_batches_held_of": float(offloads_per_eval),
        "offloads": float(len(offloads.held_at_offload)),
        "evaluations_without_sync_gradients": float(flags.count(0.0)),
        "evaluations_without_sync_gradients_of": float(len(flags)),
        "eval_accumulation_steps": float(args.accumulation),
    }
    reason = (
        f"eval_accumulation_steps={args.accumulation}: {len(offloads.held_at_offload)} offload(s) "
        f"over {offloads.steps} eval steps ({len(flags)} evaluations), at most {most} batches "
        f"held on the device; sync_gradients False as {flags.count(0.0)} of them began"
    )
    return {
        "verdict": "reproduced" if over > 0 else "clean",
        "reason": reason,
        "metrics": metrics,
        "held_at_offload": offloads.held_at_offload,
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
        "details": {
            "batches_held_at_each_offload": outcome.get("held_at_offload", []),
            "model": args.model or "tiny BERT (in code)",
        },
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
