"""peft 0.13.0-0.13.1 put LoRA on modules that were not targeted (a name that ends like a target).

Reproduces huggingface/peft#2144 ("FIX: Bug in target module optimization if child module
name is suffix of parent module name"), found through diffusers
(huggingface/diffusers#9622). peft 0.13.0 (huggingface/peft#2045, "Faster adapter loading if
there are a lot of target modules") shortens a `target_modules` list of 20 names or more to
the fewest name suffixes that match the same modules, checked against the modules that must
not match (`names_no_target`). That list was built with `name.endswith(target)`: a module
`single_transformer_blocks.0.attn.to_q` ends with the target `transformer_blocks.0.attn.to_q`,
so it was counted as targeted, left out of the check, and the shortened list (`to_q`, ...)
then matched it: LoRA went onto every block of the same shape, targeted or not. peft 0.13.2
(the patch release for #2144) compares whole dotted names.

The check, one process, seconds: a module tree named like a Flux transformer in diffusers
(`transformer_blocks.N.attn.to_q/to_k/to_v` and `single_transformer_blocks.N.attn.to_q/...`,
tiny `Linear` layers built in code), `get_peft_model(model, LoraConfig(target_modules=[the
24 projections of transformer_blocks]))`, and the set of modules that got a LoRA layer
compared with the set targeted. Metric: `untargeted_modules_adapted` (0 right, 24 on
0.13.0) and `targeted_modules_missed` (0 right); the verdict reads both.

Run it by hand (no GPU, no download: the bug is in peft's name matching, so any module tree
with such names shows it; a hub model would add only its weights):

    pip install torch "peft==0.13.0" "transformers==4.45.2"
    python peft_untargeted.py            # reproduced (exit 1): 24 untargeted modules adapted
    pip install "peft==0.13.2"
    python peft_untargeted.py            # clean (exit 0)

`--targets N` sets how many names the list holds: under 20 (peft's
`MIN_TARGET_MODULES_FOR_OPTIMIZATION`) the optimisation is never tried (the control
`few_targets`). Exit code: 0 clean, 1 reproduced, 125 cannot test (a peft that cannot be
imported here: the reason is its last line), 3 error (anything else, after its traceback).
With REPRO_RESULT set it writes the result JSON there. Standalone on purpose: it imports
nothing from the harness that runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3  # neither a verdict nor cannot-test: `git bisect run` must not read it as one
PROJECTIONS = ("to_q", "to_k", "to_v")
PREFIX = "base_model.model."  # what get_peft_model puts before the model's own module names


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument("--blocks", type=int, default=8, help="blocks of each kind")
    parser.add_argument(
        "--targets", type=int, default=0, help="target the first N projections (0: all of them)"
    )
    args = parser.parse_args(argv)
    if args.blocks < 1 or args.targets < 0:
        parser.error("--blocks must be at least 1 and --targets at least 0")
    return args


def build_model(blocks: int):
    """A module tree named like diffusers' Flux transformer: blocks and single blocks."""
    import torch

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name in PROJECTIONS:
                setattr(self, name, torch.nn.Linear(8, 8))

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attention()

    class Transformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer_blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
            self.single_transformer_blocks = torch.nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x):
            for block in [*self.transformer_blocks, *self.single_transformer_blocks]:
                x = sum(getattr(block.attn, name)(x) for name in PROJECTIONS)
            return x

    torch.manual_seed(0)
    return Transformer()


def measure(args) -> dict:
    from peft import LoraConfig, get_peft_model

    model = build_model(args.blocks)
    every = [
        f"transformer_blocks.{i}.attn.{name}" for i in range(args.blocks) for name in PROJECTIONS
    ]
    targets = every[: args.targets] if args.targets else every
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=targets))
    adapted = {
        name.removeprefix(PREFIX)
        for name, module in peft_model.named_modules()
        if hasattr(module, "lora_A") and name.startswith(PREFIX)
    }
    untargeted = sorted(adapted - set(targets))
    missed = sorted(set(targets) - adapted)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    expected_trainable = len(targets) * 2 * (8 * 2)  # lora_A (2x8) + lora_B (8x2) per target
    reproduced = bool(untargeted or missed)
    reason = (
        f"{len(targets)} modules targeted, {len(adapted)} got LoRA: "
        f"{len(untargeted)} not targeted (e.g. {untargeted[0]})"
        if untargeted
        else f"{len(targets)} modules targeted, {len(adapted)} got LoRA"
    )
    if missed:
        reason += f"; {len(missed)} targeted ones missed (e.g. {missed[0]})"
    return {
        "verdict": "reproduced" if reproduced else "clean",
        "reason": reason,
        "metrics": {
            "untargeted_modules_adapted": float(len(untargeted)),
            "targeted_modules_missed": float(len(missed)),
            "modules_targeted": float(len(targets)),
            "modules_adapted": float(len(adapted)),
            "trainable_params": float(trainable),
            "trainable_params_expected": float(expected_trainable),
        },
        "details": {"untargeted_adapted": untargeted, "targeted_missed": missed},
    }


def versions() -> dict:
    found = {}
    for name in ("torch", "peft", "transformers", "accelerate"):
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
        "details": {**outcome.get("details", {}), "blocks": args.blocks},
        "versions": versions(),
        "device": "cpu",
        "world_size": 1,
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
    try:
        import peft  # noqa: F401
    except Exception as error:  # a peft that does not import with this torch/transformers
        outcome = {
            "verdict": "cannot_test",
            "reason": f"peft does not import here: {type(error).__name__}: {error}"[:300],
            "metrics": {},
        }
    else:
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
        sys.stderr.flush()
        os._exit(ERROR_EXIT)
    sys.exit(code)
