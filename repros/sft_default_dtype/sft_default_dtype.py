"""trl's SFTTrainer trains a bf16 checkpoint in bf16 from transformers 5.0.0 on: a worse loss.

Reproduces huggingface/trl#3910 ("max_length causing training loss issues not found in
v0.19.1"), which a bisect over transformers traced to huggingface/transformers#42805
("Default auto", first released in 5.0.0): `from_pretrained` without a dtype argument now
loads a checkpoint in the dtype it was saved in ("auto") instead of float32. Hub checkpoints
are mostly saved in bf16; `SFTTrainer(model="some/checkpoint")` loads it without a dtype
(its `model_init_kwargs` are empty by default), so from 5.0.0 on the weights, the AdamW
updates and the loss are bf16, and updates smaller than bf16's resolution are lost: the
model learns less in the same steps. transformers 4.57.6 (the last 4.x) loads float32. No
release restores the old default; the workaround is `model_init_kwargs={"torch_dtype":
"float32"}` (variant `workaround`).

The check: a tiny Llama (2 layers, 64 wide) and a word-level tokenizer built in code, saved
in bf16 to a temporary folder, trained for `--steps` SFT steps on synthetic texts twice, with
INDEPENDENT seeds (model, texts, data order), as the reporter compared a run on the default
load with one on `torch_dtype=float32`: run A loaded as `SFTTrainer(model=folder)` does it
(no dtype), run B with `torch_dtype="float32"`. The metric is `loss_gap`, A's loss minus B's
(each the mean of the last 5 logged steps). When both load float32 the two runs are the same
procedure on other seeds, so the gap's mean is exactly 0 (threshold 0, known without
measuring a baseline); when the default load trains in bf16 it is positive, by about one
launch-to-launch standard deviation (README.md): one launch cannot decide, and repro.toml
judges the gap with a t-test over launches (`REPRO_SEED` draws both runs' seeds).
`default_dtype_bf16` (1 when the default load gave bf16) is the deterministic mechanism,
recorded, not judged.

Run it by hand (one process, CPU):

    pip install torch trl==0.19.1 transformers==5.0.0
    for s in $(seq 1 10); do REPRO_SEED=$s python sft_default_dtype.py; done   # gap > 0 on most
    pip install transformers==4.57.6
    for s in $(seq 1 10); do REPRO_SEED=$s python sft_default_dtype.py; done   # gap ~ 0 +- noise

`--model ID_OR_PATH` trains a hub (or local) checkpoint and its tokenizer instead of the tiny
one (a download: never done by default).

Exit code: 0 clean, 1 reproduced (this launch's gap above 0: a coin flip without the bug; the
verdict is the t-test's), 3 error (anything else, an import failure included, after
printing its traceback). With REPRO_RESULT set it writes the result JSON there. Standalone on
purpose: it imports nothing from the harness that runs it.
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
TAIL = 5  # the loss is the mean of the last TAIL logged steps (one step is noisier)
WORDS = [f"w{i}" for i in range(60)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--steps", type=int, default=20, help="SFT steps of each training")
    parser.add_argument("--lr", type=float, default=2e-5, help="SFTConfig's default rate")
    parser.add_argument(
        "--workaround", action="store_true", help="load both models with torch_dtype=float32"
    )
    parser.add_argument("--model", default="", help="a hub id or folder instead of the tiny model")
    args = parser.parse_args(argv)
    if args.steps < TAIL:
        parser.error(f"--steps must be at least {TAIL}")
    return args


def tiny_checkpoint(folder: str, seed: int) -> None:
    """A 2-layer Llama and a word-level tokenizer, saved in bf16 as hub checkpoints are."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=1,
    )  # fmt: skip
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def texts(seed: int) -> list[str]:
    """64 runs of 16 consecutive words: a pattern a tiny model can start to learn."""
    import torch

    draw = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(WORDS) - 16, (64,), generator=draw).tolist()
    return [" ".join(WORDS[s : s + 16]) for s in starts]


def train(model: str, init: dict | None, args, seed: int, out: str) -> tuple[str, list[float]]:
    """One SFT run as a user writes it: SFTTrainer(model=ID); (loaded dtype, logged losses)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        out, per_device_train_batch_size=8, max_steps=args.steps, learning_rate=args.lr,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=seed,
        max_length=32, model_init_kwargs=init, disable_tqdm=True,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_dict({"text": texts(seed)})
    )
    dtype = str(next(trainer.model.parameters()).dtype).removeprefix("torch.")
    trainer.train()
    losses = [float(log["loss"]) for log in trainer.state.log_history if "loss" in log]
    if len(losses) < TAIL:
        raise RuntimeError(f"the trainer logged {len(losses)} losses for {args.steps} steps")
    return dtype, losses


def measure(args, seed: int, work: str) -> dict:
    # Two runs with independent seeds (model, texts, data order), as the reporter compared a
    # run on the default load with one on torch_dtype=float32: run A loads as SFTTrainer
    # does, run B in float32. Without the bug they are the same procedure (gap mean 0).
    seed_a, seed_b = 2 * seed + 1, 2 * seed + 2
    model_a = model_b = args.model
    if not args.model:
        model_a, model_b = os.path.join(work, "checkpoint_a"), os.path.join(work, "checkpoint_b")
        tiny_checkpoint(model_a, seed_a)
        tiny_checkpoint(model_b, seed_b)
    default_init = {"torch_dtype": "float32"} if args.workaround else None
    dtype, default_losses = train(model_a, default_init, args, seed_a, os.path.join(work, "a"))
    fp32_dtype, fp32_losses = train(
        model_b, {"torch_dtype": "float32"}, args, seed_b, os.path.join(work, "b")
    )
    if fp32_dtype != "float32":
        raise RuntimeError(f"torch_dtype='float32' loaded {fp32_dtype}")
    loss_default = sum(default_losses[-TAIL:]) / TAIL
    loss_fp32 = sum(fp32_losses[-TAIL:]) / TAIL
    gap = loss_default - loss_fp32
    verdict = "reproduced" if gap > 0 else "clean"
    return {
        "verdict": verdict,
        "reason": (
            f"the default load gave {dtype}: loss over the last {TAIL} of {args.steps} steps "
            f"{loss_default:.4f} vs {loss_fp32:.4f} loaded in float32 (gap {gap:+.4f}, seed {seed})"
        ),
        "metrics": {
            "loss_gap": gap,
            "loss_default_load": loss_default,
            "loss_float32_load": loss_fp32,
            "default_dtype_bf16": float(dtype == "bfloat16"),
        },
        "series": {"loss_default_load": default_losses, "loss_float32_load": fp32_losses},
        "details": {"default_dtype": dtype, "model": args.model or "tiny Llama (built in code)"},
    }


def main() -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:])
    seed = int(os.environ.get("REPRO_SEED", "0"))
    work = tempfile.mkdtemp(prefix="sft_default_dtype-")
    try:
        outcome = measure(args, seed, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result(os.environ.get("REPRO_RESULT"), args, outcome, seed, started)
    print(f"[{args.variant}] {outcome['verdict']}: {outcome['reason']}", flush=True)
    return EXIT[outcome["verdict"]]


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def write_result(path, args, outcome, seed, started) -> None:
    if not path:
        return
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": outcome["verdict"],
        "reason": outcome["reason"],
        "metrics": outcome["metrics"],
        "series": outcome["series"],
        "details": {**outcome["details"], "steps": args.steps, "lr": args.lr, "tail": TAIL},
        "versions": versions(),
        "device": "cpu",
        "world_size": 1,
        "seed": seed,
        "python": platform.python_version(),
        "wall_time_s": round(time.monotonic() - started, 3),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(tmp, path)


def run() -> None:
    """main(); a failure prints its traceback (its last line says what failed) and exits
    ERROR_EXIT, never a verdict."""
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
