"""transformers#47688: a head whose forward declares **kwargs but never passes
num_items_in_batch to its loss gets GA x the gradient under gradient accumulation.

The Trainer reads `**kwargs` in forward's signature as "this model normalizes its loss by
num_items_in_batch" and skips its own division by gradient_accumulation_steps; the
sequence-classification heads compute a plain per-micro-batch mean, so nobody divides.

One optimizer step of a tiny BertForSequenceClassification (built in code, no dropout) over
the same 4 sequences, as batch 4 x GA 1 and as batch 1 x GA 4; the logged grad_norm must be
the same. Prints {"grad_norm_ratio_error": |ratio - 1|, ...}; exit 1 when it is over 0.05.
--workaround sets `model.accepts_loss_kwargs = False` (the Trainer then divides itself).
"""

import argparse
import json
import sys
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--workaround", action="store_true")
args, _ = parser.parse_known_args()
GA = 4


def grad_norm(batch: int, ga: int) -> float:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForSequenceClassification(config)
    if args.workaround:
        model.accepts_loss_kwargs = False
    ids = torch.randint(5, 100, (GA, 16), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": row, "labels": int(row[0] % 2)} for row in ids]
    with tempfile.TemporaryDirectory() as work:
        training = TrainingArguments(
            work,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=ga,
            max_steps=1,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            max_grad_norm=1e9,
            save_strategy="no",
            learning_rate=1e-3,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(model=model, args=training, train_dataset=rows)
        trainer.train()
    [norm] = [log["grad_norm"] for log in trainer.state.log_history if "grad_norm" in log]
    return float(norm)


once, accumulated = grad_norm(GA, 1), grad_norm(1, GA)
ratio = accumulated / once
print(f"grad_norm: {accumulated:.4f} over {GA} micro-batches vs {once:.4f} in one batch")
print(json.dumps({"grad_norm_ratio_error": abs(ratio - 1), "grad_norm_ratio": ratio}))
sys.exit(1 if abs(ratio - 1) > 0.05 else 0)
