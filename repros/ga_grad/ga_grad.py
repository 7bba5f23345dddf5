"""transformers 4.46.0 scales the gradients by the GA steps for models without `loss_kwargs`.

Reproduces the gradient half of huggingface/transformers#34263 ("New GA fix causes training
loss multiple times higher across the board", where users also saw "grad_norm became very
large"). transformers 4.46.0 reworked gradient accumulation (huggingface/transformers#34191,
#34198) for models whose `forward` takes `**loss_kwargs`: their loss is summed over the whole
accumulation window and divided by its token count. The Trainer's `training_step` then
multiplied every loss by `gradient_accumulation_steps` before `accelerator.backward` (which
divides by it again). For a model whose forward has no `loss_kwargs` (most models outside the
causal-LM families: BERT, RoBERTa, T5 classifiers, custom modules) the loss is still each
micro-batch's mean, so the accumulated gradient became the *sum* of GA micro-batch means:
GA x the gradient of the same batch taken at once, and the logged `grad_norm` GA x larger.
With AdamW the update's size barely changes (Adam divides by the gradient's running scale),
which is why losses looked normal while `grad_norm` did not; with SGD, or clipping at
`max_grad_norm`, the step changes too. The release that restored the division is the edge in
README.md (found by the sweep there, not from the changelog).

The check, one process, CPU, seconds: a tiny `BertForSequenceClassification` built in code
(no dropout, fixed seed), the same 4 equal-length sequences, one optimizer step taken as
`per_device_train_batch_size=4, gradient_accumulation_steps=1` and as
`per_device_train_batch_size=1, gradient_accumulation_steps=4`, with `max_grad_norm` so large
that the Trainer logs the norm but never clips. Right: the two `grad_norm`s are equal (ratio
1.000); on 4.46.0 the ratio is 4.000. Metric: `grad_norm_ratio_error` = |ratio - 1|. The
logged loss of each (`loss_accumulated`, `loss_one_batch`) is recorded, not judged.

Run it by hand:

    pip install torch "transformers==4.46.0" "accelerate==1.0.1" "numpy<2"
    python ga_grad.py            # reproduced (exit 1): grad_norm ratio 4.000
    pip install "transformers==4.45.2"
    python ga_grad.py            # clean (exit 0): ratio 1.000

`--ga N` sets the accumulation steps (the batch is N sequences), `--model ID_OR_PATH` loads a
hub (or local) sequence-classification checkpoint instead of the tiny model (a download:
never done by default). Exit code: 0 clean, 1 reproduced, 125 cannot test (a transformers
whose Trainer cannot be imported with this torch: the reason is its last line), 3 error
(anything else, after its traceback). With REPRO_RESULT set it writes the result JSON there.
Standalone on purpose: it imports nothing from the harness that runs it.
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
TOLERANCE = 0.05  # float summation order makes the two norms differ in the 6th digit at most


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--ga", type=int, default=4, help="gradient accumulation steps")
    parser.add_argument("--model", default="", help="a hub id or folder instead of the tiny model")
    args = parser.parse_args(argv)
    if args.ga < 2:
        parser.error("--ga must be at least 2")
    return args


def build_model(args):
    """The tiny classifier (or --model), the same weights for every call."""
    import torch
    from transformers import AutoModelForSequenceClassification, BertConfig

    torch.manual_seed(0)
    if args.model:
        return AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)
    from transformers import BertForSequenceClassification

    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return BertForSequenceClassification(config)


def one_step(args, batch: int, ga: int, work: str) -> tuple[float, float]:
    """(grad_norm, loss) the Trainer logs for one optimizer step over the same sequences."""
    import torch
    from transformers import Trainer, TrainingArguments

    draw = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (args.ga, 16), generator=draw)
    rows = [{"input_ids": row, "labels": int(row[0] % 2)} for row in ids]
    training = TrainingArguments(
        work, per_device_train_batch_size=batch, gradient_accumulation_steps=ga, max_steps=1,
        logging_steps=1, report_to=[], use_cpu=True, max_grad_norm=1e9, save_strategy="no",
        learning_rate=1e-3, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(model=build_model(args), args=training, train_dataset=rows)
    trainer.train()
    logs = trainer.state.log_history
    norms = [float(log["grad_norm"]) for log in logs if "grad_norm" in log]
    losses = [float(log["loss"]) for log in logs if "loss" in log]
    if len(norms) != 1 or len(losses) != 1:
        raise RuntimeError(f"expected one logged step, the trainer logged {logs}")
    return norms[0], losses[0]


def measure(args, work: str) -> dict:
    norm_once, loss_once = one_step(args, args.ga, 1, os.path.join(work, "once"))
    norm_acc, loss_acc = one_step(args, 1, args.ga, os.path.join(work, "accumulated"))
    ratio = norm_acc / norm_once
    error = abs(ratio - 1)
    verdict = "reproduced" if error > TOLERANCE else "clean"
    return {
        "verdict": verdict,
        "reason": (
            f"grad_norm over {args.ga} sequences: {norm_acc:.4f} accumulated over "
            f"{args.ga} micro-batches vs {norm_once:.4f} in one batch (ratio {ratio:.3f})"
        ),
        "metrics": {
            "grad_norm_ratio_error": error,
            "grad_norm_ratio": ratio,
            "grad_norm_accumulated": norm_acc,
            "grad_norm_one_batch": norm_once,
            "loss_accumulated": loss_acc,
            "loss_one_batch": loss_once,
        },
        "details": {"ga": args.ga, "model": args.model or "tiny BERT classifier (built in code)"},
    }


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "accelerate"):
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
        "details": outcome.get("details", {}),
        "versions": versions(),
        "device": "cpu",
        "world_size": 1,
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
    try:
        from transformers import Trainer  # noqa: F401
    except Exception as error:  # a release that does not import with this torch
        outcome = {
            "verdict": "cannot_test",
            "reason": f"the Trainer does not import here: {type(error).__name__}: {error}"[:300],
            "metrics": {},
        }
    else:
        work = tempfile.mkdtemp(prefix="ga_grad-")
        try:
            outcome = measure(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    write_result(os.environ.get("REPRO_RESULT"), args, outcome, started)
    print(f"[{args.variant}] {outcome['verdict']}: {outcome['reason']}", flush=True)
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
