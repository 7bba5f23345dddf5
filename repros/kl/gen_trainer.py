"""trl 0.12 - 0.25: the transformers.Trainer-based PPOTrainer (also used by gen_experimental).

``PPOTrainer(args, processing_class, model, ref_model, reward_model, train_dataset, value_model,
eval_dataset=...)`` (0.12 names the models policy / ref_policy; the positional order is the
same in every release), trained with ``.train()``. The reference model goes through
``prepare_deepspeed(ref, per_device_train_batch_size, fp16, bf16)``, whose bf16 comes from
``PPOConfig.bf16``, not from the accelerate config - so ``--bf16-via`` picks how bf16 is asked
for: ``accelerate`` (PPOConfig bf16=False: only the accelerate config asks), ``ppo-config``
(bf16=True as well), ``default`` (PPOConfig's own default; True from about 0.19 on).

Step-0 log-probs are tapped on objects this script owns, not inside trl: the policy's
``generate`` (trl takes the policy log-probs from the generation scores) and a forward hook on
the reference model (trl's ``forward(ref_model, query_response, pad)``). They are paired chunk
by chunk and turned into log-probs the way trl does (scores vs ref logits / temperature, masked
after the first stop / pad token). ``objective/kl`` is trl's logged value, which this
generation averages over all ranks.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile

import common

# local_rollout_forward_batch_size: generation and reference scoring go 4 sequences at a time
CHUNK = 4


def run(args, log) -> dict:
    try:
        from trl import PPOConfig, PPOTrainer
    except ImportError as exc:
        if not common.lacks(exc, "trl", ("PPOConfig", "PPOTrainer")):
            raise  # trl is there but fails to import: an error, not a missing API
        raise common.CannotTest(f"this trl has no Trainer-based PPOTrainer: {exc}") from exc
    return run_with(PPOConfig, PPOTrainer, args, log)


def _first_accelerator():
    """Build an Accelerator before PPOConfig, as the issue's script does. Needed here too: PPOConfig
    (TrainingArguments) initialises accelerate's PartialState, after which trl's own Accelerator()
    fails under DeepSpeed on accelerate 1.x ("Please make sure to properly initialize your
    accelerator"). On accelerate >= 1.13 without CUDA it also asks for gloo, else DeepSpeed sees
    num_processes=1 on a CPU host."""
    import accelerate
    import torch
    from accelerate import Accelerator

    major_minor = tuple(int(x) for x in accelerate.__version__.split(".")[:2])
    if torch.cuda.is_available() or major_minor < (1, 13):
        return Accelerator()
    from accelerate.utils import InitProcessGroupKwargs

    return Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])


def run_with(PPOConfig, PPOTrainer, args, log) -> dict:
    import time

    import torch
    import torch.nn.functional as F
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    if args.batch_size % CHUNK:
        raise ValueError(f"--batch-size must be a multiple of {CHUNK} for this trl generation")
    phases = {}
    t = time.time()
    world = _first_accelerator().num_processes
    path = common.model_path(args, log)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token

    fields = {f.name for f in dataclasses.fields(PPOConfig)}
    wanted = dict(
        output_dir=tempfile.mkdtemp(prefix="kl-ppo-"),
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        local_rollout_forward_batch_size=CHUNK,
        total_episodes=args.batch_size * world * args.steps,
        response_length=args.max_new_tokens,
        stop_token="eos",
        temperature=1.0,
        learning_rate=1.41e-5,
        num_sample_generations=0,
        missing_eos_penalty=None,
        seed=args.seed,
        kl_estimator="k1",
    )
    if "accelerator_config" in fields:
        # Keep the state built by _first_accelerator(): by default TrainingArguments resets
        # AcceleratorState but keeps a DEEPSPEED PartialState, and trl's Accelerator() then raises
        # "Please make sure to properly initialize your accelerator" on accelerate >= 1.0.
        wanted["accelerator_config"] = {"use_configured_state": True}
    if "use_cpu" in fields and not torch.cuda.is_available():
        # else TrainingArguments refuses bf16=True: "Your setup doesn't support bf16/gpu"
        wanted["use_cpu"] = True
    if args.bf16_via in ("accelerate", "ppo-config"):
        wanted["bf16"] = args.bf16_via == "ppo-config"
    config = PPOConfig(**{k: v for k, v in wanted.items() if k in fields})

    torch.manual_seed(args.seed)
    policy = AutoModelForCausalLM.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path)
    value_model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    reward_model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    for m in (policy, ref, value_model, reward_model):
        m.config.pad_token_id = tokenizer.pad_token_id
    rows = common.query_rows(args, tokenizer, args.batch_size * world * args.steps)
    train = Dataset.from_list([{"input_ids": r["input_ids"]} for r in rows])
    evals = Dataset.from_list([{"input_ids": r["input_ids"]} for r in rows[: args.batch_size]])

    # read-only taps on our own model objects
    gens, refs = [], []
    original_generate = policy.generate

    def generate(*a, **kw):
        out = original_generate(*a, **kw)
        if getattr(out, "scores", None) is not None:
            gens.append(
                (
                    kw.get("input_ids", a[0] if a else None).shape[1],
                    out.sequences.detach().clone(),
                    torch.stack(out.scores, 1).detach().clone(),
                )
            )
        return out

    policy.generate = generate

    def ref_hook(module, a, kw, output):
        ids = kw.get("input_ids", a[0] if a else None)
        refs.append((ids.detach().clone(), output.logits.detach().clone()))

    ref.register_forward_hook(ref_hook, with_kwargs=True)
    phases["setup"] = time.time() - t
    t = time.time()
    trainer = PPOTrainer(
        config, tokenizer, policy, ref, reward_model, train, value_model, eval_dataset=evals
    )
    phases["trainer_init"] = time.time() - t
    ref_prepared = getattr(trainer, "ref_model", None) or getattr(trainer, "ref_policy", None)
    rank_info = {
        "rank": trainer.accelerator.process_index,
        "policy_dtype": common.first_param_dtype(policy),
        "ref_dtype": common.first_param_dtype(ref),
        "policy_wrapper": type(trainer.model).__name__,
        "ref_wrapper": type(ref_prepared).__name__,
        "ppo_config_bf16": getattr(config, "bf16", None),
    }
    rank_info["forward_probe_max_abs_logp_diff"] = common.forward_probe(
        policy, ref_prepared, tokenizer, trainer.accelerator.device, args.seed
    )
    refs.clear()  # the probe went through the reference hook too
    t = time.time()
    trainer.train()
    phases["ppo_steps"] = time.time() - t
    shutil.rmtree(config.output_dir, ignore_errors=True)  # save_strategy="no": nothing to keep

    stop_id = getattr(config, "stop_token_id", None)
    if getattr(config, "stop_token", None) == "eos":
        stop_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id
    temperature = getattr(config, "temperature", 1.0) + 1e-7
    # the log-prob function trl's rollout uses, on tensors of the dtypes trl sees
    selective = getattr(sys.modules[PPOTrainer.__module__], "selective_log_softmax", None)

    def logprob_of(logits, tokens):
        if selective is not None:
            return selective(logits, tokens)
        return torch.gather(F.log_softmax(logits, dim=-1), 2, tokens.unsqueeze(-1)).squeeze(-1)

    per_chunk = []
    for (ctx, seq, scores), (ref_ids, ref_logits) in zip(gens, refs, strict=True):
        extra = ref_ids.shape[1] - seq.shape[1]
        # trl's batch_generation right-pads chunks that stopped early (pad / zero logits)
        if extra > 0:
            seq = F.pad(seq, (0, extra), value=pad_id)
            scores = F.pad(scores, (0, 0, 0, extra), value=0.0)
        if not torch.equal(seq.masked_fill(seq == pad_id, 0), ref_ids):  # forward() zeroes pads
            raise RuntimeError(
                f"tap pairing failed: the reference forward saw other sequences than generated "
                f"({len(gens)} generate calls, {len(refs)} reference forwards; shapes "
                f"{tuple(seq.shape)} vs {tuple(ref_ids.shape)})"
            )
        response = seq[:, ctx:]
        logp = logprob_of(scores, response)
        ref_logp = logprob_of(ref_logits[:, ctx - 1 : -1] / temperature, response)
        post = response.clone()
        # trl's truncate_response: pad everything after the first stop token
        if stop_id is not None:
            hit = (post == stop_id).int()
            after = (hit.cumsum(1) - hit) > 0
            post[after] = pad_id
        is_pad = post == pad_id
        first_pad = torch.where(
            is_pad.any(1),
            is_pad.int().argmax(1),
            torch.full_like(is_pad[:, 0], post.shape[1], dtype=torch.long),
        )
        idx = torch.arange(post.shape[1]).unsqueeze(0)
        mask = (idx < first_pad.unsqueeze(1)).float()
        per_chunk.append(common.step_measure(logp, ref_logp, mask))
    chunks_per_step = max(1, args.batch_size // CHUNK)
    steps = [per_chunk[i : i + chunks_per_step] for i in range(0, len(per_chunk), chunks_per_step)]
    if not steps:
        raise RuntimeError("no rollout was captured (did trl generate through policy.generate?)")

    def combine(chunks):
        n = sum(c["response_tokens"] for c in chunks)
        return {
            "max_abs_logp_diff": max(c["max_abs_logp_diff"] for c in chunks),
            "local_kl": sum(c["local_kl"] for c in chunks) / len(chunks),  # equal-size chunks
            "response_tokens": n,
            "tokens_differing": sum(c["tokens_differing"] for c in chunks),
        }

    per_step = [combine(s) for s in steps]
    logged = [h["objective/kl"] for h in trainer.state.log_history if "objective/kl" in h]
    step0 = per_step[0]
    kl0 = logged[0] if logged else step0["local_kl"]
    rank_info.update(
        objective_kl_step0=kl0,
        objective_kl_is_global_mean=bool(logged),
        kl_sign=common.sign_word(kl0),
        local_kl_step0=step0["local_kl"],
        max_abs_logp_diff=step0["max_abs_logp_diff"],
        response_tokens_step0=step0["response_tokens"],
        tokens_differing_step0=step0["tokens_differing"],
        objective_kl_series=logged,
        local_kl_series=[s["local_kl"] for s in per_step],
        max_abs_logp_diff_series=[s["max_abs_logp_diff"] for s in per_step],
        scores_dtype=str(gens[0][2].dtype).replace("torch.", ""),
        ref_logits_dtype=str(refs[0][1].dtype).replace("torch.", ""),
        phase_seconds={k: round(v, 2) for k, v in phases.items()},
        **common.env_threads(),
    )
    run = common.run_info(trainer, trainer.model, args, path)
    return {"rank": rank_info, "run": run}
