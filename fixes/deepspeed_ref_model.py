"""Workaround for huggingface/trl#506 on trl <= 0.7.1: the PPO reference model through DeepSpeed.

The bug: under ``accelerate`` + DeepSpeed with ``mixed_precision: bf16``, DeepSpeed casts the
policy to bf16, but trl <= 0.7.1 only moves the reference model to the device
(``self.ref_model = self.ref_model.to(self.accelerator.device)``), so it stays fp32. At PPO step 0
the two models hold the same weights, yet their log-probs differ and ``objective/kl`` is
nonzero (often negative). trl 0.7.2 fixed it (PR #758, commit c02ce6d): the reference model
goes through ``deepspeed.initialize`` with the policy's DeepSpeed config - bf16 included, ZeRO
stage forced to 0 unless it is 3 - and is put in ``eval()`` mode. This module does the same for
trl 0.4.7 - 0.7.1, without editing trl. Unlike trl 0.7.2 it deep-copies the DeepSpeed config
instead of rewriting the accelerate plugin's config in place, so
``accelerator.state.deepspeed_plugin`` still reports the policy's ZeRO stage afterwards.

Use it in a training script (copy this file next to it, or put ``fixes/`` on ``PYTHONPATH``),
either explicitly after building the trainer::

    from deepspeed_ref_model import prepare_ref_model

    ppo_trainer = PPOTrainer(config, model, ref_model, tokenizer, dataset, data_collator=collator)
    ppo_trainer.ref_model = prepare_ref_model(ppo_trainer.accelerator, ppo_trainer.ref_model)

or by patching trl once, before the trainer is built::

    import deepspeed_ref_model

    deepspeed_ref_model.apply()   # PPOTrainer.__init__ now ends with prepare_ref_model(...)

Both are no-ops when DeepSpeed is not in use, when the reference model is already a
DeepSpeed engine, and (``apply``) on trl >= 0.7.2, which does this itself. (On the
Trainer-based PPOTrainer of trl 0.12 - 1.0 the reference model is prepared with bf16 only when
``PPOConfig(bf16=True)``: ask for bf16 there as well as in the accelerate config.) Launch as usual,
e.g. ``accelerate launch --config_file zero2_bf16.yaml train.py``.
"""

from __future__ import annotations

import copy
import functools

__all__ = ["apply", "prepare_ref_model"]

FIRST_FIXED_TRL = (0, 7, 2)


def _is_deepspeed(accelerator) -> bool:
    return (
        str(accelerator.distributed_type).endswith("DEEPSPEED")
        and getattr(accelerator.state, "deepspeed_plugin", None) is not None
    )


def prepare_ref_model(accelerator, ref_model):
    """Return ``ref_model`` wrapped in an eval-mode DeepSpeed engine configured like the policy.

    Call it after the policy has been prepared (i.e. after ``PPOTrainer(...)``), so that
    accelerate has filled the ``"auto"`` entries of the DeepSpeed config.
    """
    if ref_model is None or not _is_deepspeed(accelerator):
        return ref_model
    import deepspeed

    if isinstance(ref_model, deepspeed.DeepSpeedEngine):
        return ref_model
    inner = getattr(ref_model, "pretrained_model", ref_model)
    if getattr(inner, "is_loaded_in_8bit", False) or getattr(inner, "is_loaded_in_4bit", False):
        return ref_model  # quantized models are already placed; trl leaves them alone too

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    autos = [k for k, v in config.items() if v == "auto"]
    if autos:
        raise ValueError(
            f"DeepSpeed config still has 'auto' entries {autos}: call prepare_ref_model "
            "after the policy has been prepared (after PPOTrainer(...))"
        )
    zero = config.setdefault("zero_optimization", {})
    if zero.get("stage", 0) == 3:
        # Shard the reference model too (trl PR #758 sets the same sizes, as dotted top-level keys).
        hidden = None
        model_config = getattr(ref_model, "config", None)
        if model_config is not None:
            sizes = getattr(model_config, "hidden_sizes", None)
            hidden = max(sizes) if sizes else getattr(model_config, "hidden_size", None)
        if hidden is not None:
            zero.update(
                reduce_bucket_size=hidden * hidden,
                stage3_param_persistence_threshold=10 * hidden,
                stage3_prefetch_bucket_size=0.9 * hidden * hidden,
            )
    else:
        # Inference only: a full replica per rank; only the dtype handling of DeepSpeed is wanted.
        zero["stage"] = 0
    engine, *_ = deepspeed.initialize(model=ref_model, config=config)
    engine.eval()
    return engine


def _trl_version() -> tuple:
    import re

    import trl

    m = re.match(r"(\d+)\.(\d+)\.(\d+)", trl.__version__)
    return tuple(int(g) for g in m.groups()) if m else (0, 0, 0)


def apply() -> str:
    """Patch ``trl.PPOTrainer.__init__`` (trl < 0.7.2) to end with :func:`prepare_ref_model`.

    Returns a one-line description of what was done.
    """
    import trl
    from trl.trainer import ppo_trainer as module

    if _trl_version() >= FIRST_FIXED_TRL:
        return (
            f"not applied: trl {trl.__version__} prepares the reference model with DeepSpeed itself"
        )
    cls = module.PPOTrainer
    if getattr(cls.__init__, "_deepspeed_ref_model_fix", False):
        return "already applied"
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not getattr(self, "is_peft_model", False):
            self.ref_model = prepare_ref_model(self.accelerator, self.ref_model)

    __init__._deepspeed_ref_model_fix = True
    cls.__init__ = __init__
    return (
        f"patched trl {trl.__version__} PPOTrainer.__init__: "
        "the reference model goes through deepspeed.initialize"
    )
