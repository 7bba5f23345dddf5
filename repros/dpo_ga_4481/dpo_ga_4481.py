"""Under transformers 4.48.1, trl's DPOTrainer logs the loss x gradient_accumulation_steps.

Reproduces huggingface/transformers#35856 ("DPO LoRA loss incorrect with Gradient Accumulation
in 4.48.1"), reported against trl's DPOTrainer. transformers 4.46 made the Trainer scale the
loss of models whose forward takes `**kwargs` by the number of items in the whole accumulated
batch, and stop dividing their loss by the GA steps itself (the model is then expected to do
it, given `num_items_in_batch`). huggingface/transformers#35651 (released in 4.48.1, the fix of
transformers#35663) made `training_step` skip its own division whenever
`model_accepts_loss_kwargs` is true and no `compute_loss_func` is set. A Llama's forward takes
`**kwargs`, so that holds for DPOTrainer too, but DPOTrainer computes its own loss and never
uses `num_items_in_batch`: nothing divides it, and with GA=4 the loss it logs (and the
gradient it steps with) is 4x the per-batch DPO loss. The culprit is a transformers release,
the symptom trl's; trl 0.14.0 (huggingface/trl#2615) sets `model_accepts_loss_kwargs = False`
in DPOTrainer. No transformers release restores the old division for it.

The check: a tiny Llama and a word-level tokenizer built in code (nothing downloaded), 4
preference pairs of plain text, one optimizer step of `DPOTrainer` taken once as
`per_device_train_batch_size=4, gradient_accumulation_steps=1` and once as
`per_device_train_batch_size=1, gradient_accumulation_steps=4`. At the first step the policy
equals its reference copy, so each pair's DPO loss is exactly ln 2 whatever the data: the two
logged losses must be equal. Metric `logged_loss_ratio` is GA=4's over GA=1's (1.000 clean,
4.000 when the division is skipped), and the verdict reads `logged_loss_ratio_error` =
|ratio - 1| (reproduced above 0.05).

Run it by hand (one process, CPU, about half a minute):

    pip install torch "transformers==4.48.1" "trl==0.13.0"
    python dpo_ga_4481.py            # reproduced (exit 1): ratio 4.000
    pip install "transformers==4.47.1"
    python dpo_ga_4481.py            # clean (exit 0): ratio 1.000
    pip install "transformers==4.48.1" "trl==0.14.0"
    python dpo_ga_4481.py            # clean (exit 0): trl's fix

`--model NAME` builds the policy from a hub config instead (random weights; the tokenizer
stays the word-level one, so its vocabulary must be at least 64). Exit code: 0 clean, 1
reproduced, 125 cannot test (a trl that cannot import with this transformers, with the
reason), 3 error (anything else, after its traceback). With REPRO_RESULT set it writes the
result JSON there. Standalone on purpose: it imports nothing from the harness that runs it.
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
WORDS = [f"w{i}" for i in range(60)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--ga", type=int, default=4, help="gradient accumulation steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="", help="a hub config name instead of the tiny Llama")
    return parser.parse_args(argv)


def build_tokenizer():
    """A word-level tokenizer over WORDS (ids 2..61), with pad 0 and eos 1: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(["<pad>", "<eos>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")


def build_model(args):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    if args.model:
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def pairs(count: int):
    """Plain-text preference pairs: a 4-word prompt, a 4-word chosen and rejected answer."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "prompt": [" ".join(WORDS[i : i + 4]) for i in range(count)],
            "chosen": [" ".join(WORDS[i + 4 : i + 8]) for i in range(count)],
            "rejected": [" ".join(WORDS[i + 9 : i + 13]) for i in range(count)],
        }
    )


def first_logged_loss(args, trl, tokenizer, batch_size: int, ga: int) -> float:
    """One DPO optimizer step over the same pairs; the loss the Trainer logs for it."""
    from transformers import TrainerCallback

    class Keep(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    keep = Keep()
    with tempfile.TemporaryDirectory() as out:
        config = trl.DPOConfig(
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
            max_length=32,
            max_prompt_length=16,
        )
        trainer = trl.DPOTrainer(
            model=build_model(args),
            args=config,
            train_dataset=pairs(args.ga),
            processing_class=tokenizer,
            callbacks=[keep],
        )
        trainer.train()
    if not keep.losses:
        raise RuntimeError("the Trainer logged no loss")
    return keep.losses[0]


def import_trl():
    """trl, or the one-line reason it cannot be imported beside this transformers."""
    try:
        import trl

        trl.DPOConfig, trl.DPOTrainer  # noqa: B018 - the lazy import happens here
    except (ImportError, AttributeError) as error:
        return None, "trl cannot import here: " + " ".join(str(error).split())[:300]
    return trl, ""


def measure(args) -> dict:
    trl, reason = import_trl()
    if trl is None:
        return {"verdict": "cannot_test", "reason": reason, "metrics": {}}
    tokenizer = build_tokenizer()
    one_batch = first_logged_loss(args, trl, tokenizer, batch_size=args.ga, ga=1)
    accumulated = first_logged_loss(args, trl, tokenizer, batch_size=1, ga=args.ga)
    ratio = accumulated / one_batch
    error = abs(ratio - 1.0)
    metrics = {
        "logged_loss_ratio": ratio,
        "logged_loss_ratio_error": error,
        "loss_one_batch": one_batch,
        "loss_accumulated": accumulated,
        "gradient_accumulation_steps": float(args.ga),
    }
    reason = (
        f"DPO loss logged with bs=1, GA={args.ga}: {accumulated:.4f}; with bs={args.ga}, GA=1: "
        f"{one_batch:.4f} (ln 2 = 0.6931 per pair at step 0); ratio {ratio:.3f}"
    )
    return {
        "verdict": "reproduced" if error > TOLERANCE else "clean",
        "reason": reason,
        "metrics": metrics,
    }


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets", "numpy"):
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
        "details": {"model": args.model or "tiny Llama (in code)"},
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
