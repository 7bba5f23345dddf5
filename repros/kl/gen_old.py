"""trl 0.4 - 0.11: the issue's own API.

``PPOTrainer(config, model, ref_model, tokenizer, dataset, data_collator)``, ``.generate``,
``.step(queries, responses, rewards)`` - the gpt2-sentiment example line by line, with the
offline model / reward swapped in. The step-0 log-probs are read where trl itself computes
objective/kl: ``PPOTrainer.record_step_stats`` gets ``logprobs``, ``ref_logprobs`` and
``masks`` as keyword arguments in every release of this generation; a wrapper records them
and calls the original unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses

import common


def _api():
    """trl's old-API names, or CannotTest when this trl has none."""
    try:
        from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer, set_seed
    except ImportError as exc:
        if not common.lacks(
            exc, "trl", ("AutoModelForCausalLMWithValueHead", "PPOConfig", "PPOTrainer", "set_seed")
        ):
            raise  # trl is there but fails to import: an error, not a missing API
        raise common.CannotTest(f"this trl has no old-API PPOTrainer: {exc}") from exc
    return AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer, set_seed


def _trainer(args, log, path, tokenizer, seed: int, n_rows: int):
    """The example's PPOTrainer: fresh policy and reference from `path`, `n_rows` queries made
    from `seed`, and a read-only tap on trl's own KL inputs (the list it fills, one entry per
    step)."""
    from datasets import Dataset

    value_head_model, PPOConfig, PPOTrainer, set_seed = _api()
    wanted = dict(
        model_name=path,
        learning_rate=1.41e-5,
        log_with=None,
        mini_batch_size=args.batch_size,
        batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        early_stopping=False,
        target_kl=0.1,
        kl_penalty="kl",
        seed=seed,
    )
    fields = {f.name for f in dataclasses.fields(PPOConfig)}
    config = PPOConfig(**{k: v for k, v in wanted.items() if k in fields})
    dataset = Dataset.from_list(
        common.query_rows(argparse.Namespace(**{**vars(args), "seed": seed}), tokenizer, n_rows)
    )
    dataset.set_format(type="torch")

    def collator(data):
        return dict((key, [d[key] for d in data]) for key in data[0])

    set_seed(config.seed)
    model = value_head_model.from_pretrained(path)
    ref_model = value_head_model.from_pretrained(path)
    trainer = PPOTrainer(
        config, model, ref_model, tokenizer, dataset=dataset, data_collator=collator
    )
    captured: list[dict] = []
    original = trainer.record_step_stats

    def record_step_stats(*a, **data):  # read-only tap on trl's own KL inputs
        captured.append(common.step_measure(data["logprobs"], data["ref_logprobs"], data["masks"]))
        return original(*a, **data)

    trainer.record_step_stats = record_step_stats
    return trainer, captured


def _one_step(trainer, batch, tokenizer, reward, generation_kwargs, generate_batch: int) -> float:
    """trl's own generate + step on one batch; its objective/kl."""
    import torch

    query_tensors = batch["input_ids"]
    response_tensors = trainer.generate(
        query_tensors, return_prompt=False, batch_size=generate_batch, **generation_kwargs
    )
    batch["response"] = tokenizer.batch_decode(response_tensors)
    texts = [q + r for q, r in zip(batch["query"], batch["response"], strict=True)]
    rewards = [torch.tensor(float(s)) for s in reward(texts)]
    stats = trainer.step(query_tensors, response_tensors, rewards)
    return float(stats["objective/kl"])


def run(args, log) -> dict:
    if args.criterion == "signed-kl":
        return run_signed_kl(args, log)
    import time

    phases = {}
    t = time.time()
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    _api()
    phases["import"] = time.time() - t
    t = time.time()
    accelerator = Accelerator()  # as in the example; PPOTrainer builds its own on the same state
    phases["accelerator"] = time.time() - t
    t = time.time()
    path = common.model_path(args, log)
    phases["ppo_config"] = time.time() - t
    t = time.time()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.eos_token
    n_rows = args.batch_size * accelerator.num_processes * args.steps
    phases["tokenizer_data"] = time.time() - t
    t = time.time()
    trainer, captured = _trainer(args, log, path, tokenizer, args.seed, n_rows)
    phases["trainer_init"] = time.time() - t  # DeepSpeed init (and its one-time op build)

    reward = common.reward_function(args, trainer.accelerator.device)
    generation_kwargs = dict(
        common.GENERATION_KWARGS,
        pad_token_id=tokenizer.eos_token_id,
        max_new_tokens=args.max_new_tokens,
    )
    unwrap = trainer.accelerator.unwrap_model
    rank_info = {
        "rank": trainer.accelerator.process_index,
        "policy_dtype": common.first_param_dtype(trainer.model),
        "ref_dtype": common.first_param_dtype(trainer.ref_model),
        "policy_wrapper": type(trainer.model).__name__,
        "ref_wrapper": type(trainer.ref_model).__name__,
        "policy_lm_training": unwrap(trainer.model).pretrained_model.training,
        "ref_lm_training": unwrap(trainer.ref_model).pretrained_model.training,
    }
    rank_info["forward_probe_max_abs_logp_diff"] = common.forward_probe(
        unwrap(trainer.model), trainer.ref_model, tokenizer, trainer.accelerator.device, args.seed
    )
    objective_kl = []
    t = time.time()
    for step, batch in enumerate(trainer.dataloader):
        if step >= args.steps:
            break
        # the example's generate batch (4)
        objective_kl.append(_one_step(trainer, batch, tokenizer, reward, generation_kwargs, 4))
        log(
            f"step {step}: objective/kl {objective_kl[-1]:+.6f}, "
            f"max |logp - ref_logp| {captured[-1]['max_abs_logp_diff']:.3g}"
        )
    phases["ppo_steps"] = time.time() - t
    if not captured:
        raise RuntimeError("no PPO step ran (dataset too small?)")

    step0 = captured[0]
    rank_info.update(
        objective_kl_step0=objective_kl[0],
        kl_sign=common.sign_word(objective_kl[0]),
        local_kl_step0=step0["local_kl"],
        max_abs_logp_diff=step0["max_abs_logp_diff"],
        response_tokens_step0=step0["response_tokens"],
        tokens_differing_step0=step0["tokens_differing"],
        logprobs_dtype=step0["logprobs_dtype"],
        ref_logprobs_dtype=step0["ref_logprobs_dtype"],
        objective_kl_series=objective_kl,
        local_kl_series=[c["local_kl"] for c in captured],
        max_abs_logp_diff_series=[c["max_abs_logp_diff"] for c in captured],
        phase_seconds={k: round(v, 2) for k, v in phases.items()},
        **common.env_threads(),
    )
    # the policy's DeepSpeedEngine (trl 0.7.2 rewrites the plugin's config to stage 0)
    run = common.run_info(trainer, trainer.model, args, path)
    return {"rank": rank_info, "run": run}


def run_signed_kl(args, log) -> dict:
    """The signed step-0 KL over many sequences: for each of `--seeds` seeds a fresh policy and
    reference (the same weights), new queries, one PPO step of trl's own, and every sequence's
    KL as trl's objective/kl averages it (the masked sum over response tokens of logprob -
    ref_logprob, read from the same record_step_stats tap). Step 0 only: after a step the
    policy has trained and its KL is no longer the #506 question."""
    import gc
    import time

    from accelerate import Accelerator
    from transformers import AutoTokenizer

    phases = {"trainer_init": 0.0, "ppo_steps": 0.0}
    accelerator = Accelerator()
    path = common.model_path(args, log)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.eos_token
    generation_kwargs = dict(
        common.GENERATION_KWARGS,
        pad_token_id=tokenizer.eos_token_id,
        max_new_tokens=args.max_new_tokens,
    )
    n_rows = args.batch_size * accelerator.num_processes
    per_sequence: list[float] = []
    seeds, objective_kl, max_diff = [], [], 0.0
    rank_info: dict = {}
    trainer = None
    for i in range(args.seeds):
        seed = args.seed + i
        t = time.time()
        trainer, captured = _trainer(args, log, path, tokenizer, seed, n_rows)
        phases["trainer_init"] += time.time() - t
        if not rank_info:
            rank_info = {
                "rank": trainer.accelerator.process_index,
                "policy_dtype": common.first_param_dtype(trainer.model),
                "ref_dtype": common.first_param_dtype(trainer.ref_model),
            }
        reward = common.reward_function(args, trainer.accelerator.device)
        t = time.time()
        batch = next(iter(trainer.dataloader))
        # generate in big batches (the example's 4 is 60x slower here); the step is trl's own
        objective_kl.append(
            _one_step(trainer, batch, tokenizer, reward, generation_kwargs, args.batch_size)
        )
        phases["ppo_steps"] += time.time() - t
        step0 = captured[0]
        per_sequence += step0["kl_per_sequence"]
        max_diff = max(max_diff, step0["max_abs_logp_diff"])
        seeds.append(seed)
        log(
            f"seed {seed}: objective/kl {objective_kl[-1]:+.6f} over "
            f"{len(step0['kl_per_sequence'])} sequences"
        )
        if i + 1 < args.seeds:
            del trainer, captured
            gc.collect()
    rank_info.update(
        seeds=seeds,
        objective_kl_per_seed=objective_kl,
        kl_per_sequence=per_sequence,
        max_abs_logp_diff=max_diff,
        phase_seconds={k: round(v, 2) for k, v in phases.items()},
        **common.env_threads(),
    )
    run = common.run_info(trainer, trainer.model, args, path)
    return {"rank": rank_info, "run": run}
