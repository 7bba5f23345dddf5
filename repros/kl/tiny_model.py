"""Offline stand-in for lvwerra/gpt2-imdb, imdb and lvwerra/distilbert-imdb.

Everything is built locally from a recipe, so the repro needs no model hub:

* a byte-level tokenizer (256 byte tokens + ``<|endoftext|>``, GPT-2's byte-to-unicode map,
  no merges), saved as a ``PreTrainedTokenizerFast``;
* a synthetic corpus of short movie reviews from a small template grammar (fixed seed);
* a tiny GPT-2 (2 layers, 64 dims) trained on that corpus in fp32 for a few hundred steps, so
  its next-token distributions are peaked like a real LM's (a random init has nearly flat
  distributions, which shrinks the bf16-vs-fp32 log-prob gap to ~1e-4);
* a synthetic "sentiment" reward (positive minus negative words in the text).

The trained model is saved with ``save_pretrained`` and cached on disk under a key that is a
hash of the recipe: ``$REPRO_CACHE/<hash>`` when ``REPRO_CACHE`` is set, else
``~/.cache/reprobox/kl-models/<hash>``. Concurrent ranks are safe: the first one to take an
exclusive file lock builds into a temporary directory and renames it into place; the others
block on the lock and then load the finished directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

EOS = "<|endoftext|>"

# Bump RECIPE["version"] whenever the code below changes what gets built.
RECIPE = {
    "version": 2,
    "arch": {
        "model_type": "gpt2",
        "vocab_size": 257,
        "n_positions": 128,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "bos_token_id": 256,
        "eos_token_id": 256,
    },
    "corpus": {"seed": 1234, "n_reviews": 4000},
    # intra-op threads change float reductions: fixed, so the weights are too
    "train": {
        "seed": 0,
        "steps": 300,
        "batch_size": 32,
        "seq_len": 64,
        "lr": 3e-3,
        "warmup": 20,
        "threads": 1,
    },
}

_SUBJECTS = [
    "this movie",
    "the film",
    "the acting",
    "the plot",
    "the ending",
    "the story",
    "the cast",
    "the music",
    "the script",
    "the director",
]
_VERBS = ["was", "is", "felt", "seemed"]
_ADVERBS = ["really", "very", "quite", "so", "truly", ""]
POSITIVE = ["great", "wonderful", "brilliant", "good", "beautiful", "funny", "moving", "excellent"]
NEGATIVE = ["bad", "boring", "terrible", "awful", "dull", "weak", "silly", "poor"]
_OPENERS = ["", "", "honestly, ", "i think ", "overall ", "to be fair, "]
_LINKS = [" and ", " but ", ". ", ". also ", ", yet "]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (same order, so token id == byte)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def make_corpus(seed: int, n_reviews: int) -> list[str]:
    rng = random.Random(seed)

    def clause() -> str:
        words = POSITIVE if rng.random() < 0.5 else NEGATIVE
        adv = rng.choice(_ADVERBS)
        return " ".join(
            w for w in (rng.choice(_SUBJECTS), rng.choice(_VERBS), adv, rng.choice(words)) if w
        )

    reviews = []
    for _ in range(n_reviews):
        text = rng.choice(_OPENERS) + clause()
        for _ in range(rng.randint(1, 3)):
            text += rng.choice(_LINKS) + clause()
        reviews.append(text + ".")
    return reviews


def synthetic_reward(text: str) -> float:
    """Stand-in for the distilbert-imdb sentiment logit: #positive - #negative words."""
    words = text.replace(".", " ").replace(",", " ").split()
    return float(sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words))


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("REPRO_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "reprobox" / "kl-models"
    return base / recipe_hash()


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab[EOS] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS
    )


def _train(tokenizer, out: Path) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    t0 = time.time()
    arch = {k: v for k, v in RECIPE["arch"].items() if k != "model_type"}
    tr = RECIPE["train"]
    threads = torch.get_num_threads()
    torch.set_num_threads(tr["threads"])
    torch.manual_seed(tr["seed"])
    model = GPT2LMHeadModel(GPT2Config(**arch)).float()

    ids: list[int] = []
    for review in make_corpus(**RECIPE["corpus"]):
        ids.extend(tokenizer.encode(review))
        ids.append(tokenizer.eos_token_id)
    data = torch.tensor(ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(tr["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / tr["warmup"]))
    model.train()
    loss = None
    for _ in range(tr["steps"]):
        starts = torch.randint(0, len(data) - tr["seq_len"] - 1, (tr["batch_size"],), generator=gen)
        batch = torch.stack([data[s : s + tr["seq_len"]] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    # trl 0.4.0/0.4.1 look for pytorch_model.bin in a local model dir (to find a saved v_head)
    torch.save(model.state_dict(), out / "pytorch_model.bin")
    tokenizer.save_pretrained(out)
    info = {
        "recipe": RECIPE,
        "recipe_hash": recipe_hash(),
        "final_train_loss": float(loss.detach()),
        "build_seconds": round(time.time() - t0, 2),
        "torch": torch.__version__,
    }
    (out / "reprobox_recipe.json").write_text(json.dumps(info, indent=1))
    return info


def ensure_model(log=print) -> Path:
    """Return the directory of the cached tiny model + tokenizer, building it once if needed."""
    target = cache_dir()
    if (target / "reprobox_recipe.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other ranks wait here while one builds
        if not (target / "reprobox_recipe.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            os.chmod(tmp, 0o755)
            try:
                info = _train(_build_tokenizer(), tmp)
                if target.exists():  # a partial directory left by a killed build
                    shutil.rmtree(target)
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            log(
                f"[kl] built tiny model {target.name} in {info['build_seconds']} s "
                f"(final train loss {info['final_train_loss']:.3f})"
            )
    return target


def make_queries(tokenizer, n: int, seed: int, min_len: int = 4, max_len: int = 12):
    """Prompts like the imdb example's: a review's first 4..11 tokens (bytes here)."""
    rng = random.Random(seed)
    reviews = make_corpus(seed + 1, n)
    rows = []
    for review in reviews:
        ids = tokenizer.encode(review)[: rng.randrange(min_len, max_len)]
        rows.append({"input_ids": ids, "query": tokenizer.decode(ids)})
    return rows


if __name__ == "__main__":  # build (or locate) the cached model by hand
    print(ensure_model())
