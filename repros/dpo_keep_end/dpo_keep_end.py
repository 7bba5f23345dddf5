"""trl 0.14.0-0.17.x: DPOTrainer's default keep_end truncation wipes the short rows of a batch.

Reproduces huggingface/trl#3382 ("keep_end + max_length causes NaNs in trainer_state.json":
with trl 0.16.0, the short answers of a batch end up all padding, with an all-zero loss mask).
trl 0.14.0 (huggingface/trl#2551, "Reintroduce `truncation_mode` in `DPOTrainer`") made
`concatenated_forward` truncate by `truncation_mode`: each batch's prompt + completion rows are
flushed left (real tokens at the start, padding at the end) and then, with the default
`truncation_mode="keep_end"`, cut to the LAST `max_length` columns:
`input_ids[:, -max_length:]`. When one row of the batch is longer than `max_length`, every shorter
row loses its beginning and, if it is short enough, all of its
real tokens: only padding is left, its log-probabilities are 0 under both the policy and the
reference, its DPO loss is the constant ln 2 and it gives no gradient. The short pairs of
every batch that holds one long pair are silently lost. huggingface/trl#3398 (first released in
0.18.0) flushes right before keeping the end and left again after, so each row keeps its own
end. `truncation_mode="keep_start"` was never affected; trl 0.13.0 always kept the start.

What a user sees is a model that learned less from the same data, by an amount that depends on
the seed. The check trains the same tiny Llama (built in code with a word-level tokenizer:
nothing downloaded; CPU, seconds) twice with DPOTrainer and INDEPENDENT seeds (init, data and
data order), as a user comparing two runs would: run A with the default `truncation_mode`
("keep_end"), run B with `truncation_mode="keep_start"`. The data: short informative pairs (a
4-word prompt; the chosen answer maps each word through one fixed permutation, the rejected
through another) mixed with LONG pairs (a prompt longer than `max_length`) whose chosen and
rejected answers are IDENTICAL. With the sigmoid loss an identical pair's gradient is exactly 0
whatever part of it is kept, so without the bug A and B are the same procedure: the held-out
DPO loss of A minus B's (`eval_loss_gap`, computed by this script's own code on held-out short
pairs, against each run's own initial model as the reference) has mean exactly 0 (threshold 0,
known without measuring a baseline). With the bug A loses the short pairs of every batch that
holds a long one, learns less and its held-out loss is higher. The sizes are chosen so that the
shift is about one launch-to-launch standard deviation (README.md): one launch cannot decide,
and repro.toml judges the gap by a t-test over repeated launches (`REPRO_SEED` draws the two
runs' seeds and the held-out set). `wiped_short_rows` (how many of a probe batch's 7 short
pairs come out of run A's trainer with log-probability exactly 0: 7 on a bad release, 0 on a
good one) records the mechanism; the rule does not read it.

Run it by hand:

    pip install torch "trl==0.14.0" "transformers==4.51.3" "accelerate==1.6.0" "datasets==3.5.0"
    for s in 1 2 3 4 5 6 7 8; do REPRO_SEED=$s python dpo_keep_end.py; done   # gap > 0 on most
    pip install "trl==0.13.0"
    for s in 1 2 3 4 5 6 7 8; do REPRO_SEED=$s python dpo_keep_end.py; done   # gap ~ 0 +- noise

Exit code: 0 clean, 1 reproduced (this launch's gap above 0: a coin flip without the bug; the
verdict is the t-test's), 125 cannot test (a trl that cannot import beside this transformers,
with the reason), 3 error. With REPRO_RESULT set it writes the result JSON there. Standalone
on purpose: it imports nothing from the harness that runs it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback

EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3
WORDS = [f"w{i}" for i in range(30)]  # ids 2..31; 0 pad, 1 eos
PROMPT = 4  # words in a short prompt (and in each answer)
LONG_PROMPT = 24  # words in a long prompt: with its answer and eos, longer than MAX_LENGTH
MAX_LENGTH = 16  # a short pair (4 + 4 + eos = 9 tokens) always fits
BETA = 0.1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of each run")
    parser.add_argument("--batch", type=int, default=8, help="pairs per batch")
    parser.add_argument("--long", type=float, default=0.015, help="share of long (identical) pairs")
    parser.add_argument("--lr", type=float, default=2e-3)
    return parser.parse_args(argv)


def build_tokenizer():
    """A word-level tokenizer over WORDS (ids 2..31), with pad 0 and eos 1: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(["<pad>", "<eos>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")


def build_model(seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(WORDS) + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def permutations():
    """The task: chosen maps each prompt word through GOOD, rejected through BAD (fixed)."""
    import torch

    fixed = torch.Generator().manual_seed(20250501)
    good = torch.randperm(len(WORDS), generator=fixed)
    bad = torch.randperm(len(WORDS), generator=fixed)
    return good, bad


def short_pairs(n: int, generator):
    """n prompts of PROMPT word indices, and their chosen and rejected answers."""
    import torch

    good, bad = permutations()
    prompts = torch.randint(0, len(WORDS), (n, PROMPT), generator=generator)
    return prompts, good[prompts], bad[prompts]


def text(row) -> str:
    return " ".join(WORDS[int(i)] for i in row)


def train_set(n: int, share_long: float, generator):
    """Short informative pairs, and long pairs whose chosen and rejected are the same text."""
    import torch
    from datasets import Dataset

    prompts, chosen, rejected = short_pairs(n, generator)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    is_long = torch.rand(n, generator=generator) < share_long
    for i in range(n):
        if is_long[i]:
            prompt = torch.randint(0, len(WORDS), (LONG_PROMPT,), generator=generator)
            answer = torch.randint(0, len(WORDS), (PROMPT,), generator=generator)
            rows["prompt"].append(text(prompt))
            rows["chosen"].append(text(answer))
            rows["rejected"].append(text(answer))
        else:
            rows["prompt"].append(text(prompts[i]))
            rows["chosen"].append(text(chosen[i]))
            rows["rejected"].append(text(rejected[i]))
    return Dataset.from_dict(rows)


def completion_logps(model, prompts, answers):
    """Sum of log p(answer + eos | prompt) per row, by hand (every row has the same length)."""
    import torch

    eos = torch.ones(len(prompts), 1, dtype=torch.long)
    ids = torch.cat([prompts + 2, answers + 2, eos], dim=1)
    logits = model(input_ids=ids).logits[:, :-1]
    logps = torch.log_softmax(logits.float(), dim=-1).gather(2, ids[:, 1:, None]).squeeze(2)
    return logps[:, PROMPT - 1 :].sum(dim=1)


def held_out_loss(model, reference, pairs) -> float:
    """Mean DPO (sigmoid) loss on held-out short pairs: the same code on every trl release."""
    import torch
    import torch.nn.functional as F

    prompts, chosen, rejected = pairs
    model.eval()
    with torch.no_grad():
        margin = completion_logps(model, prompts, chosen) - completion_logps(
            model, prompts, rejected
        )
        ref = completion_logps(reference, prompts, chosen) - completion_logps(
            reference, prompts, rejected
        )
        return float(-F.logsigmoid(BETA * (margin - ref)).mean())


def wiped(trainer, model) -> int:
    """Of a batch of 1 long + 7 short pairs, the short pairs left with log-probability 0."""
    import torch

    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    longs = [r for r in rows if len(r["prompt_input_ids"]) > MAX_LENGTH]
    shorts = [r for r in rows if len(r["prompt_input_ids"]) <= MAX_LENGTH]
    if not longs or len(shorts) < 7:
        return -1
    batch = trainer.data_collator([longs[0], *shorts[:7]])
    batch = {k: (v.to("cpu") if hasattr(v, "to") else v) for k, v in batch.items()}
    with torch.no_grad():
        out = trainer.concatenated_forward(model, batch)
    return int((out["chosen_logps"][1:] == 0).sum())


def train(args, trl, tokenizer, seed: int, mode: str):
    """One DPO run; returns the trained policy, its initial copy and the mechanism probe."""
    import torch

    model = build_model(seed)
    reference = copy.deepcopy(model)
    data = train_set(args.steps * args.batch, args.long, torch.Generator().manual_seed(seed + 7))
    with tempfile.TemporaryDirectory() as out:
        kwargs = {}
        if mode is not None:
            kwargs["truncation_mode"] = mode
        config = trl.DPOConfig(
            out,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1,
            max_steps=args.steps,
            num_train_epochs=1,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            beta=BETA,
            loss_type="sigmoid",
            max_length=MAX_LENGTH,
            logging_steps=10_000,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            seed=seed,
            data_seed=seed,
            **kwargs,
        )
        trainer = trl.DPOTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer
        )
        probe = wiped(trainer, reference)
        trainer.train()
    return trainer.model, reference, probe


def import_trl():
    """trl, or the one-line reason it cannot be imported beside this transformers."""
    try:
        import trl

        trl.DPOConfig, trl.DPOTrainer  # noqa: B018 - the lazy import happens here
    except (ImportError, AttributeError) as error:
        return None, "trl cannot import here: " + " ".join(str(error).split())[:300]
    return trl, ""


def measure(args, seed: int) -> dict:
    import torch

    trl, reason = import_trl()
    if trl is None:
        return {"verdict": "cannot_test", "reason": reason, "metrics": {}}
    tokenizer = build_tokenizer()
    seed_a, seed_b = 2 * seed + 1, 2 * seed + 2
    run_a, ref_a, wiped_a = train(args, trl, tokenizer, seed_a, mode=None)  # the default
    run_b, ref_b, wiped_b = train(args, trl, tokenizer, seed_b, mode="keep_start")
    pairs = short_pairs(512, torch.Generator().manual_seed(10_000 + seed))
    loss_a = held_out_loss(run_a, ref_a, pairs)
    loss_b = held_out_loss(run_b, ref_b, pairs)
    gap = loss_a - loss_b
    verdict = "reproduced" if gap > 0 else "clean"
    return {
        "verdict": verdict,
        "reason": (
            f"held-out DPO loss after {args.steps} steps: {loss_a:.4f} with the default "
            f"truncation_mode vs {loss_b:.4f} with keep_start (gap {gap:+.4f}, seed {seed}; "
            f"ln 2 = {math.log(2):.4f} untrained; {wiped_a} of 7 short pairs wiped in a probe "
            "batch; one launch does not decide, the t-test over launches does)"
        ),
        "metrics": {
            "eval_loss_gap": gap,
            "eval_loss_default": loss_a,
            "eval_loss_keep_start": loss_b,
            "wiped_short_rows": float(wiped_a),
            "wiped_short_rows_of": 7.0,
            "wiped_short_rows_keep_start": float(wiped_b),
        },
        "details": {
            "steps": args.steps,
            "batch": args.batch,
            "share_long": args.long,
            "lr": args.lr,
            "max_length": MAX_LENGTH,
            "default_truncation_mode": trl.DPOConfig("unused", report_to=[]).truncation_mode,
        },
    }


def versions() -> dict:
    found = {}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets", "numpy"):
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
        "details": outcome.get("details", {}),
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


def main() -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:])
    seed = int(os.environ.get("REPRO_SEED", "0"))
    import torch

    torch.set_num_threads(1)
    from transformers.utils import logging

    logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    outcome = measure(args, seed)
    write_result(os.environ.get("REPRO_RESULT"), args, outcome, seed, started)
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
