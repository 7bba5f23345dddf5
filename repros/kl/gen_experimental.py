"""trl 0.26 - 1.12: the Trainer-based PPOTrainer moved to ``trl.experimental.ppo``.

Same constructor and training loop as gen_trainer (0.26 re-exports it under the new path and
the old path is gone from 1.0); PPOConfig's bf16 defaults to True. trl 1.13 removed PPO.
"""

from __future__ import annotations

import common
import gen_trainer


def run(args, log) -> dict:
    try:
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except ImportError as exc:
        if not common.lacks(exc, "trl.experimental.ppo", ("PPOConfig", "PPOTrainer")):
            raise  # trl is there but fails to import: an error, not a missing API
        raise common.CannotTest(
            f"this trl has no PPO trainer (trl.experimental.ppo): {exc}"
        ) from exc
    return gen_trainer.run_with(PPOConfig, PPOTrainer, args, log)
