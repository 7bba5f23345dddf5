"""Pieces every trl API generation's adapter shares: models, prompts, reward, step-0 measurement."""

from __future__ import annotations

import os

import tiny_model


class CannotTest(Exception):
    """This host / version set cannot run the repro: verdict cannot_test, exit 125."""


def lacks(exc: ImportError, module: str, names: tuple[str, ...]) -> bool:
    """Whether this ImportError says only that the installed trl has no `module` (or no `names`
    in it): the PPO API generation is absent, a cannot-test. An ImportError raised while that
    module imports something else (an incompatible transformers, a broken install) names
    another module, and is an error."""
    if isinstance(exc, ModuleNotFoundError):  # `from trl.experimental.ppo import ...`, no such
        name = exc.name or ""
        return "." in name and (module == name or module.startswith(name + "."))
    return exc.name == module and any(f"cannot import name '{n}'" in str(exc) for n in names)


HUB_MODEL = "lvwerra/gpt2-imdb"
HUB_REWARD_MODEL = "lvwerra/distilbert-imdb"
HUB_DATASET = "imdb"

# The example's sampling settings (gpt2-sentiment.py); max_new_tokens comes from --max-new-tokens.
GENERATION_KWARGS = {"min_length": -1, "top_k": 0.0, "top_p": 1.0, "do_sample": True}


def model_path(args, log) -> str:
    """Where policy, reference and tokenizer are loaded from (a hub id with --hub)."""
    if args.hub:
        return HUB_MODEL
    return str(tiny_model.ensure_model(log=log))


def query_rows(args, tokenizer, n: int) -> list[dict]:
    """n prompts: imdb review prefixes with --hub (as the example builds them), else synthetic."""
    if not args.hub:
        return tiny_model.make_queries(tokenizer, n, seed=args.seed)
    import random

    from datasets import load_dataset

    rng = random.Random(args.seed)
    ds = load_dataset(HUB_DATASET, split="train").filter(
        lambda x: len(x["text"]) > 200, batched=False
    )
    rows = []
    for text in ds.select(range(n))["text"]:
        ids = tokenizer.encode(text)[: rng.randrange(2, 8)]  # LengthSampler(2, 8)
        rows.append({"input_ids": ids, "query": tokenizer.decode(ids)})
    return rows


def reward_function(args, device):
    """texts -> list of float rewards: the sentiment pipeline with --hub, else synthetic."""
    if not args.hub:
        return lambda texts: [tiny_model.synthetic_reward(t) for t in texts]
    from transformers import pipeline

    pipe = pipeline("sentiment-analysis", model=HUB_REWARD_MODEL, device=device)
    kwargs = {"top_k": None, "function_to_apply": "none", "batch_size": 16}

    def score(texts):
        out = pipe(texts, **kwargs)
        return [next(d["score"] for d in o if d["label"] in ("POSITIVE", "LABEL_1")) for o in out]

    return score


def sign_word(x: float) -> str:
    return "negative" if x < 0 else "positive" if x > 0 else "zero"


def first_param_dtype(module) -> str:
    for p in module.parameters():
        return str(p.dtype).replace("torch.", "")
    return "none"


def step_measure(logprobs, ref_logprobs, mask) -> dict:
    """What step 0 must show when policy == reference: zero difference on every response token.

    ``local_kl`` is trl's own formula for objective/kl (old API): mean over sequences of the
    masked sum of logprob - ref_logprob, on this rank only; ``kl_per_sequence`` is that masked
    sum per sequence (what the mean averages: trl's ``objective/kl_dist``).
    """

    diff = (logprobs.float() - ref_logprobs.float()) * mask
    on = mask.bool()
    per_sequence = diff.sum(-1)
    return {
        "max_abs_logp_diff": float(diff.abs().max()) if on.any() else 0.0,
        "local_kl": float(per_sequence.mean()),
        "kl_per_sequence": [float(x) for x in per_sequence],
        "response_tokens": int(on.sum()),
        "tokens_differing": int(((diff != 0) & on).sum()),
        "logprobs_dtype": str(logprobs.dtype).replace("torch.", ""),
        "ref_logprobs_dtype": str(ref_logprobs.dtype).replace("torch.", ""),
        "mean_logprob": float((logprobs.float() * mask).sum() / mask.sum().clamp(min=1)),
    }


def forward_probe(policy, ref, tokenizer, device, seed: int = 0) -> float:
    """Max |log p_policy - log p_ref| over every position of a few fixed, unpadded sequences, with
    both models run by plain forward passes on identical input, as prepared by trl, before any
    training. Isolates "the two models compute different functions" (the #506 root cause: bf16
    policy vs fp32 reference) from differences in how trl obtains the two sets of log-probs
    (e.g. generation scores vs a forward pass in trl >= 0.12)."""
    import torch
    import torch.nn.functional as F

    texts = tiny_model.make_corpus(seed + 7, 4)
    ids = [tokenizer.encode(t) for t in texts]
    n = min(min(len(i) for i in ids), 48)
    batch = torch.tensor([i[:n] for i in ids], device=device)

    def logits(model):
        out = model(input_ids=batch)
        out = out[0] if isinstance(out, tuple) else out.logits
        return F.log_softmax(out.float(), -1)

    # fork_rng: trl's value head keeps dropout on, so a forward pass would shift the sampling RNG
    with torch.no_grad(), torch.random.fork_rng():
        return float((logits(policy) - logits(ref)).abs().max())


def backend_name() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def env_threads() -> dict:
    import torch

    return {
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def run_info(trainer, engine, args, path: str) -> dict:
    """What every generation records about the run: device, backend, DeepSpeed's settings."""
    state = trainer.accelerator.state
    return {
        "device": str(trainer.accelerator.device),
        "backend": backend_name(),
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(state.distributed_type),
        "mixed_precision": str(state.mixed_precision),
        "zero_stage": engine.zero_optimization_stage()
        if hasattr(engine, "zero_optimization_stage")
        else None,
        "ds_bf16": engine.bfloat16_enabled() if hasattr(engine, "bfloat16_enabled") else None,
        "model": path if args.hub else f"tiny-gpt2 (offline, {path.rsplit('/', 1)[-1]})",
    }
