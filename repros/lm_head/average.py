"""Averaging a tied model's weights through `state_dict()` gives lm_head = world_size x mean.

Reproduces huggingface/transformers#32272 (also filed as pytorch/pytorch#132027). In a tied
model `state_dict()` holds the input embedding and `lm_head.weight` as two entries sharing one
storage, and `deepcopy` keeps that aliasing. The reporter's loop

    dist.all_reduce(avg[k], op=SUM); avg[k] = avg[k] / world_size

sums the shared storage once per alias but rebinds only one key to the quotient, so the last
alias of a group of k ends at world_size**(k-1) x the true mean (GPT-2: k=2, 4x at 4 ranks).

Run it as the reporter did, with 4 workers (gloo on CPU, NCCL on GPUs):

    torchrun --nproc_per_node 4 average.py --averaging sum_div          # reproduces
    PYTHONPATH=../../fixes torchrun --nproc_per_node 4 average.py --fix tied_average  # clean

It compares the averaged output embedding with the true mean over ranks (allclose, rtol 1e-5),
not with the input embedding: after `load_state_dict` both are the same wrong tensor, so an
"lm_head == wte" check passes on the broken model. Exit code: 0 clean, 1 reproduced,
125 cannot test here (fewer than 2 ranks; for avg_op, a torch without ReduceOp.AVG or an older
gloo's refusal of it), 3 error (anything else, after printing its traceback). With
REPRO_RESULT set, rank 0 writes the result JSON there.
Standalone on purpose: it imports nothing from the harness that runs it.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import platform
import sys
import time
import traceback

RTOL, ATOL = 1e-5, 1e-8
EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125}
ERROR_EXIT = 3  # neither a verdict nor cannot-test: `git bisect run` must not read it as one
# What an older gloo raises for all_reduce(op=AVG) (measured on torch 2.1.2; gloo AVG came with
# pytorch PR #149781). The only failure of avg_op that means "cannot test here".
GLOO_NO_AVG = "Cannot use ReduceOp.AVG with Gloo"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="adhoc", help="label recorded in the result")
    parser.add_argument(
        "--averaging",
        choices=["sum_div", "avg_op", "fix"],
        default="sum_div",
        help="sum_div: the reporter's SUM-then-divide loop; avg_op: all_reduce(op=AVG); "
        "fix: the averaging function of --fix",
    )
    parser.add_argument("--fix", help="module with average_state_dict(state_dict) (in fixes/)")
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "bert", "t5"])
    parser.add_argument("--untie", action="store_true", help="tie_word_embeddings=False")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.fix:
        args.averaging = "fix"
    elif args.averaging == "fix":
        parser.error("--averaging fix needs --fix MODULE")
    return args


def planned_cases() -> list[tuple[list[str], str | None]]:
    """(arguments, result path) of each case: the command line, or a harness plan file
    (REPRO_PLAN) that runs several variants in one launch to pay the start-up once."""
    plan = os.environ.get("REPRO_PLAN")
    if not plan:
        return [(sys.argv[1:], os.environ.get("REPRO_RESULT"))]
    with open(plan) as handle:
        return [(case["args"], case["result"]) for case in json.load(handle)["cases"]]


def build_model(family: str, untie: bool):
    """A tiny model of the family, from config only (no hub), as in the report."""
    import transformers as tf

    tie = {"tie_word_embeddings": not untie}
    if family == "gpt2":
        # The report: GPT2Config.from_pretrained("gpt2") shrunk to 2 layers, 32 dims, 2 heads.
        config = tf.GPT2Config(n_positions=32, n_layer=2, n_embd=32, n_head=2, **tie)
        return tf.AutoModelForCausalLM.from_config(config)
    if family == "llama":
        config = tf.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
            **tie,
        )
        return tf.AutoModelForCausalLM.from_config(config)
    if family == "bert":
        config = tf.BertConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=32,
            **tie,
        )
        return tf.BertForMaskedLM(config)
    config = tf.T5Config(
        d_model=32, d_ff=64, d_kv=16, num_layers=2, num_decoder_layers=2, num_heads=2, **tie
    )
    return tf.T5ForConditionalGeneration(config)


def sum_div_average(model, dist):
    """The reporter's allreduce_model_weights_SUM_DIV, verbatim in substance."""
    avg_params = copy.deepcopy(model.state_dict())
    for name in avg_params:
        dist.all_reduce(avg_params[name], op=dist.ReduceOp.SUM)
        avg_params[name] = avg_params[name] / dist.get_world_size()
    return avg_params


def avg_op_average(model, dist):
    """The reporter's allreduce_model_weights_AVG."""
    avg_params = copy.deepcopy(model.state_dict())
    for name in avg_params:
        dist.all_reduce(avg_params[name], op=dist.ReduceOp.AVG)
    return avg_params


def avg_refusal(exc: BaseException, backend: str) -> str | None:
    """The cannot-test reason when `exc` is gloo refusing ReduceOp.AVG (older torch), else None:
    only that known refusal means "this torch cannot test avg_op"; anything else is an error."""
    if backend != "gloo" or not isinstance(exc, RuntimeError) or GLOO_NO_AVG not in str(exc):
        return None
    return f"gloo: {GLOO_NO_AVG} (this torch's gloo has no AVG; added by pytorch PR #149781)"


def true_mean(state, dist):
    """The mean over ranks of every entry, each reduced on its own copy (no aliasing)."""
    mean = {}
    for name, tensor in state.items():
        total = tensor.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        mean[name] = total / dist.get_world_size()
    return mean


def alias_groups(state) -> list[list[str]]:
    """Keys that share a storage, in state_dict order (only groups of two or more)."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def measure(model, averaged, mean, world_size: int, loop_is_broken: bool) -> dict:
    import torch

    def violation(a, m) -> float:  # > 0 exactly when torch.allclose(a, m, RTOL, ATOL) fails
        return float(((a - m).abs() - (ATOL + RTOL * m.abs())).max())

    def factor(a, m) -> float:  # least-squares scale s with a ~= s * m
        a, m = a.double().flatten(), m.double().flatten()
        return float(torch.dot(a, m) / torch.dot(m, m))

    modules = {module: name for name, module in model.named_modules()}
    target = f"{modules[model.get_output_embeddings()]}.weight"
    source = f"{modules[model.get_input_embeddings()]}.weight"
    groups = alias_groups(model.state_dict())
    # The broken loop leaves the i-th alias of a group (from 0) at world_size**i x the mean;
    # a correct averaging leaves every key at 1x.
    predicted = {
        key: float(world_size**i) if loop_is_broken else 1.0
        for g in groups
        for i, key in enumerate(g)
    }
    prediction_errors = [abs(factor(averaged[k], mean[k]) - p) / p for k, p in predicted.items()]
    wrong = [k for k in averaged if violation(averaged[k].float(), mean[k].float()) > 0]

    # What a user sees after loading: both ends of the tie hold the same (wrong) tensor.
    loaded = copy.deepcopy(model)
    loaded.load_state_dict(averaged)
    loaded_state = loaded.state_dict()
    return {
        "target_key": target,
        "alias_groups": groups,
        "wrong_keys": wrong,
        "metrics": {
            # how far past allclose's tolerance lm_head went: 0 when allclose holds
            "lm_head_excess_over_tolerance": max(0.0, violation(averaged[target], mean[target])),
            "lm_head_over_mean": factor(averaged[target], mean[target]),
            "predicted_lm_head_factor": predicted.get(target, 1.0),
            "max_factor_prediction_error": max(prediction_errors, default=0.0),
            "aliased_keys": float(sum(len(g) for g in groups)),
            "wrong_keys": float(len(wrong)),
            "wrong_keys_of": float(len(averaged)),
            "loaded_wte_over_mean": factor(loaded_state[source], mean[source]),
            "loaded_lm_head_equals_wte": float(
                torch.equal(loaded_state[target], loaded_state[source])
            ),
        },
    }


def main() -> int:
    started = time.monotonic()
    cases = [(parse_args(argv), result) for argv, result in planned_cases()]
    # Import fixes before any collective, so a missing module fails every rank alike.
    fixes = {args.fix: importlib.import_module(args.fix) for args, _ in cases if args.fix}
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend=backend, init_method="env://")
    codes = []
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(device)
        for args, result_path in cases:
            outcome = {"verdict": "cannot_test", "reason": "", "metrics": {}}
            if world_size < 2:
                outcome["reason"] = "needs at least 2 ranks (run it under torchrun)"
            else:
                outcome = run_case(args, fixes.get(args.fix), dist, torch, device, rank, world_size)
            ranks = [None] * world_size
            dist.all_gather_object(ranks, {"rank": rank, **outcome.get("per_rank", {})})
            if rank == 0:
                info = {"backend": backend, "device": str(device), "world_size": world_size}
                write_result(result_path, args, outcome, ranks, info, started)
                print(f"[{args.variant}] {outcome['verdict']}: {outcome['reason']}", flush=True)
            codes.append(EXIT[outcome["verdict"]])
            started = time.monotonic()
        dist.barrier()  # rank 0 has written every result before any rank exits
    finally:
        dist.destroy_process_group()  # a forked worker can hang at exit without it
    # One case: its verdict. Several: reproduced if any is, else cannot-test if any is.
    return 1 if 1 in codes else (125 if 125 in codes else 0)


def run_case(args, fix, dist, torch, device, rank: int, world_size: int) -> dict:
    torch.manual_seed(args.seed + rank)  # every rank holds different weights
    model = build_model(args.model, args.untie).to(device)
    # The report: "Add 1 to make results more clear."
    for _, param in model.named_parameters():
        noise = torch.normal(mean=1.0, std=0.5, size=param.data.shape, device=param.data.device)
        param.data = param.data + noise
    local = model.get_output_embeddings().weight.detach()
    mean = true_mean(model.state_dict(), dist)

    if args.averaging == "sum_div":
        averaged = sum_div_average(model, dist)
    elif args.averaging == "avg_op":
        if not hasattr(dist.ReduceOp, "AVG"):
            return {"verdict": "cannot_test", "reason": "this torch has no ReduceOp.AVG"}
        try:
            averaged = avg_op_average(model, dist)
        except RuntimeError as exc:
            reason = avg_refusal(exc, str(dist.get_backend()))
            if reason is None:
                raise  # any other failure of the collective is an error, never a skip
            return {"verdict": "cannot_test", "reason": reason}
    else:
        averaged = fix.average_state_dict(model.state_dict())

    found = measure(model, averaged, mean, world_size, args.averaging == "sum_div")
    metrics = found["metrics"]
    reproduced = metrics["lm_head_excess_over_tolerance"] > 0
    reason = (
        f"{found['target_key']} = {metrics['lm_head_over_mean']:.6g} x the true mean "
        f"(predicted {metrics['predicted_lm_head_factor']:g}); "
        f"{len(found['wrong_keys'])} of {len(averaged)} keys wrong"
    )
    return {
        "verdict": "reproduced" if reproduced else "clean",
        "reason": reason,
        "metrics": metrics,
        "details": {k: found[k] for k in ("target_key", "alias_groups", "wrong_keys")},
        "per_rank": {
            "local_lm_head_mean": float(local.double().mean()),
            "lm_head_over_mean": metrics["lm_head_over_mean"],
        },
    }


def write_result(path, args, outcome, ranks, info, started) -> None:
    if not path:
        return
    versions = {}
    for package in ("torch", "transformers", "numpy", "tokenizers", "safetensors"):
        try:
            versions[package] = importlib.import_module(package).__version__
        except ImportError:
            pass
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": outcome["verdict"],
        "reason": outcome["reason"],
        "metrics": outcome["metrics"],
        "details": {
            **outcome.get("details", {}),
            "model": args.model,
            "averaging": args.averaging,
            "untie": args.untie,
            "fix": args.fix,
        },
        "ranks": ranks,
        "versions": versions,
        **info,
        "seed": args.seed,
        "python": platform.python_version(),
        "wall_time_s": round(time.monotonic() - started, 3),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(tmp, path)


def run() -> None:
    """main() on every rank; a failure prints its traceback (its last line says what failed)
    and exits ERROR_EXIT at once, without waiting on peers that may be stuck in a collective."""
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
