"""huggingface/trl#506: DeepSpeed ZeRO-2 + bf16 gives nonzero (reported negative) KL at PPO step 0.

The trl gpt2-sentiment PPO example in miniature, run under the issue's own accelerate config
(DEEPSPEED, ZeRO stage 2, mixed_precision bf16, 2 processes):

    accelerate launch --config_file repros/kl/zero2_bf16.yaml repros/kl/ppo_step0.py

At PPO step 0 the policy and the reference model hold identical weights, so every per-token
``logprob - ref_logprob`` must be exactly 0 and trl's logged ``objective/kl`` must be 0 on every
rank. In trl <= 0.7.1 DeepSpeed casts the policy to bf16 while the reference model is only moved
to the device and stays fp32, so the two disagree (fixed by trl PR #758, released in 0.7.2).

Verdict (exit code, ``git bisect run`` convention): 1 reproduced when the largest per-token
|logprob - ref_logprob| over response tokens at step 0 exceeds 1e-6 on any rank or objective/kl
at step 0 is nonzero on any rank; 0 clean otherwise; 125 cannot test here, only for known
conditions (a version set this host cannot run, told apart by version before launching; a trl
without PPO; a module of MISSING_MODULES absent; DeepSpeed's C++ op build failing with no
compiler or ninja on PATH); 2 error, for anything else (its last traceback line in the result).

Offline by default: a tiny GPT-2 and a byte-level tokenizer are built locally (tiny_model.py)
and a synthetic reward replaces the sentiment pipeline. ``--hub`` uses the example's
lvwerra/gpt2-imdb, imdb and lvwerra/distilbert-imdb instead (needs hub access).

With ``REPRO_RESULT=path`` rank 0 writes the result JSON there (see repros/README.md).
``--fix MODULE`` imports MODULE (e.g. fixes/deepspeed_ref_model.py on PYTHONPATH) and calls its
``apply()`` before the trainer is built.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from importlib import metadata  # noqa: E402

THRESHOLD = 1e-6
# --criterion signed-kl: a sign is "systematic" only past this many standard errors, on the
# pooled sequences and on the seed batches' means, with every rank's mean of the same sign,
# at least MIN_PER_RANK sequences on every rank (below that, a handful of sequences with one
# big KL would read as certain) and at least MIN_BATCHES (seed, rank) batches. The batch-level
# z guards against sequences of one batch that are not independent (they share its padding
# and shapes), which would make the sequence-level standard error too small.
Z_THRESHOLD = 3.0
# The seed batches' means decide: their t (mean / SE over the batches) must pass Student's t
# critical value at this two-sided false-alarm rate, df = batches - 1 (and 3.0). 3.0 alone let
# 2% of null runs of 8 batches (1 rank) and 6% of 4 batches through when batches differ
# (tests/bench/bench_signed_kl_null.py measures it); the sequence-level z cannot guard
# against that (the sequences of one batch are not independent).
BATCH_ALPHA = 0.01
MIN_PER_RANK = 200
MIN_BATCHES = 4
Z_CAP = 1e6  # |z| shown when every sequence has the same nonzero KL (standard error 0)
EXIT = {"clean": 0, "reproduced": 1, "cannot_test": 125, "error": 2}
# sibling modules (common, gen_*, tiny_model), also when run through runpy
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CannotTest  # noqa: E402

RECORDED_ENV = (
    "DS_ACCELERATOR",
    "OMP_NUM_THREADS",
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_USE_DEEPSPEED",
    "TORCH_EXTENSIONS_DIR",
)
PACKAGES = (
    "torch",
    "trl",
    "transformers",
    "accelerate",
    "deepspeed",
    "datasets",
    "tokenizers",
    "numpy",
)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def log(msg: str) -> None:
    print(f"[kl rank {rank()}] {msg}", flush=True)


def parse_version(text: str) -> tuple:
    """'0.7.1' -> (0, 7, 1); '2.13.0+cpu' -> (2, 13, 0); '0.8.0.dev0' -> (0, 8, 0)."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else (0, 0, 0)


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="manual", help="label recorded in the result")
    p.add_argument(
        "--fix", default=None, help="module whose apply() is called before the trainer is built"
    )
    p.add_argument(
        "--hub", action="store_true", help="use lvwerra/gpt2-imdb, imdb and lvwerra/distilbert-imdb"
    )
    p.add_argument(
        "--steps", type=int, default=3, help="PPO steps to run (the KL series); step 0 decides"
    )
    p.add_argument(
        "--batch-size", type=int, default=16, help="PPO batch size per rank (mini batch = batch)"
    )
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the first seed (default: REPRO_SEED x --seeds, so repeated launches with seeds "
        "0, 1, 2, ... never share a seed; 0 without REPRO_SEED)",
    )
    p.add_argument(
        "--bf16-via",
        choices=["accelerate", "ppo-config", "default"],
        default="accelerate",
        help="trl >= 0.12 only: ask for bf16 through the accelerate config only (PPOConfig "
        "bf16=False), also through PPOConfig(bf16=True), or leave PPOConfig's default",
    )
    p.add_argument(
        "--preflight",
        action="store_true",
        help="only check, in one plain process, that this host and version set can run the "
        "repro (exit 0), else write a cannot_test result (exit 125); the harness runs this "
        "before launching, since some version sets break accelerate launch itself",
    )
    p.add_argument(
        "--criterion",
        choices=["step0", "forward-probe", "signed-kl"],
        default="step0",
        help="step0: the issue's check, per-token logp - ref_logp and objective/kl at PPO step 0; "
        "forward-probe: both prepared models on one identical input (trl >= 0.12, whose step-0 "
        "log-probs come from generation scores and are never exactly the forward's); "
        "signed-kl: a measurement, the sign of the step-0 KL over --seeds x --batch-size "
        "sequences per rank (one fresh PPO step per seed; old API only)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="signed-kl only: PPO step-0 runs, seeds --seed .. --seed + N - 1 (fresh models "
        "from the same weights, new queries each)",
    )
    p.add_argument(
        "--api",
        choices=["auto", "old", "trainer", "experimental"],
        default="auto",
        help="trl PPO API generation (auto: from the installed trl version)",
    )
    args = p.parse_args(argv)
    if args.seed is None:  # a harness's repeated launch: its own block of --seeds seeds
        args.seed = int(os.environ.get("REPRO_SEED", "0")) * max(1, args.seeds)
    return args


# --------------------------------------------------------------------------------------------
# preflight: decide cannot_test before anything heavy is imported
# --------------------------------------------------------------------------------------------
def pick_generation(trl_version: tuple, requested: str) -> str:
    if requested != "auto":
        return requested
    if trl_version < (0, 4, 0):
        raise CannotTest(
            f"trl {'.'.join(map(str, trl_version))} predates the accelerate-based "
            "PPOTrainer (generate/step API of the issue): generation not supported"
        )
    if trl_version < (0, 4, 2):
        raise CannotTest(
            f"trl {'.'.join(map(str, trl_version))} has no DeepSpeed support in PPOTrainer "
            "(it prepares the reference model with the same Accelerator; added in 0.4.2)"
        )
    if trl_version < (0, 12, 0):
        return "old"
    if trl_version < (0, 26, 0):
        return "trainer"
    return "experimental"


def extensions_dir() -> str:
    """One JIT-extension cache per environment. DeepSpeed builds a C++ op (deepspeed_shm_comm on
    CPU) at its first init; torch rebuilds it whenever the include paths change, so environments
    sharing the default ~/.cache/torch_extensions rebuild it (~40 s on 2 cores) on every switch."""
    import hashlib

    key = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    if os.environ.get("REPRO_CACHE"):  # the harness's cache folder for this repro
        return os.path.join(os.environ["REPRO_CACHE"], "torch_extensions", key)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "reprobox", "torch_extensions", key)


def build_ops_first(log) -> None:
    """Build (or load) the op DeepSpeed JIT-builds at its first init (deepspeed_shm_comm on
    CPU) before any rank gets there, one process at a time, under an flock the kernel drops
    when its holder dies; first removing the build locks a killed build left.

    DeepSpeed's own build at init waits on torch's bare-file lock, which a killed build
    leaves behind for ever (`clear_stale_batons`); and a lock removed while another rank
    waits on it makes that rank import a library nobody built. Under the flock no rank of
    any launch of this environment is waiting when a stale lock is removed, and once the op
    is built DeepSpeed's own load at init finds it and builds nothing."""
    import fcntl

    root = os.environ["TORCH_EXTENSIONS_DIR"]
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".reprobox-build.flock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        for lock in clear_stale_batons(root):
            log(f"removed a stale JIT-extension lock (its build was killed): {lock}")
        import deepspeed.comm.torch as ds_torch

        build = getattr(ds_torch, "build_shm_op", None)  # DeepSpeed's own; absent: none
        if build is not None:
            build()


def clear_stale_batons(root: str, settle_s: float = 1.0) -> list[str]:
    """Remove the JIT-extension locks under `root` that no process holds; the ones removed.

    torch's build lock (`FileBaton`) is a bare file, created with O_EXCL and held open by its
    builder until just before it is removed. A build killed mid-way (a timeout, Ctrl-C,
    kill -9) leaves it behind, and every later load of the op in that folder waits on it
    forever: DeepSpeed's `build_shm_op` at init hung every launch of an environment after
    one such kill. A lock that no process has open is one whose builder is gone; each is
    looked at again after `settle_s`, so a release between its close and its remove is not
    mistaken for one. Without /proc nothing can be told, and nothing is removed."""
    if not os.path.isdir("/proc/self/fd"):
        return []
    locks = [os.path.join(root, d, "lock") for d in _listdir(root)]
    stale = [lock for lock in locks if os.path.exists(lock) and not _held_open(lock)]
    if not stale:
        return []
    time.sleep(settle_s)
    removed = []
    for lock in stale:
        if os.path.exists(lock) and not _held_open(lock):
            try:
                os.remove(lock)
            except FileNotFoundError:
                continue  # another rank removed it
            removed.append(lock)
    return removed


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _held_open(path: str) -> bool:
    """Whether any process this user can see has `path` open (its descriptors in /proc)."""
    real = os.path.realpath(path)
    for pid in _listdir("/proc"):
        if not pid.isdigit():
            continue
        fds = os.path.join("/proc", pid, "fd")
        for fd in _listdir(fds):
            try:
                if os.readlink(os.path.join(fds, fd)) == real:
                    return True
            except OSError:
                continue
    return False


def preflight(args) -> dict:
    versions = {name: dist_version(name) for name in PACKAGES}
    for name in ("torch", "trl", "transformers", "accelerate"):
        if versions[name] is None:
            raise CannotTest(f"{name} is not installed")
    if versions["deepspeed"] is None:
        raise CannotTest("deepspeed is not installed: the bug needs the DeepSpeed ZeRO-2 engine")
    import torch  # cheap enough, and needed to know whether CUDA is there

    cuda = torch.cuda.is_available()
    if not cuda:
        if parse_version(versions["accelerate"]) < (0, 29, 0):
            raise CannotTest(
                f"accelerate {versions['accelerate']} hard-codes nccl/cuda for DeepSpeed "
                "(CPU hosts need accelerate >= 0.29)"
            )
        if parse_version(versions["deepspeed"]) < (0, 14, 1):
            raise CannotTest(
                f"deepspeed {versions['deepspeed']} cannot run on CPU (imports oneccl "
                "unconditionally; CPU hosts need deepspeed >= 0.14.1)"
            )
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    gen = pick_generation(parse_version(versions["trl"]), args.api)
    if args.criterion == "signed-kl" and gen != "old":
        raise CannotTest(
            f"--criterion signed-kl reads trl's own step-0 KL inputs through the old API's "
            f"record_step_stats (trl 0.4.2 - 0.11); trl {versions['trl']} has the {gen} API"
        )
    return {"versions_installed": versions, "cuda": cuda, "generation": gen}


# --------------------------------------------------------------------------------------------
# distributed plumbing and the result file
# --------------------------------------------------------------------------------------------
def _ensure_process_group():
    import torch.distributed as dist

    if not dist.is_available():
        return None
    if not dist.is_initialized() and world_size() > 1:
        dist.init_process_group("gloo")  # env:// from the launcher; only on early exits
    return dist if dist.is_initialized() else None


def gather(obj) -> list:
    dist = _ensure_process_group()
    if dist is None:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def write_result(result: dict) -> None:
    path = os.environ.get("REPRO_RESULT")
    if not path:
        return
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".result-", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, path)


def _wait_for_rank0_result(limit_s: float = 90.0) -> None:
    """Early exit without a usable process group: give rank 0 time to write before we exit
    (the launcher kills the other ranks as soon as one exits nonzero)."""
    path = os.environ.get("REPRO_RESULT")
    deadline = time.time() + (limit_s if path else 5.0)
    while time.time() < deadline:
        if path and os.path.exists(path) and os.path.getmtime(path) >= T_START:
            return
        time.sleep(0.5)


def _meet_after_failure(limit_s: float = 120.0) -> bool:
    """After a failure, wait (bounded) for every rank to reach its end too, so that all exit
    together: `accelerate launch` stops the peers of the first rank that exits nonzero with
    SIGTERM, which reads as a crash, not as this rank's verdict. The failure may come before
    the process group exists (DeepSpeed builds its op first), so a gloo group is made here with
    the bound as its timeout. False when a peer is dead or stuck and the bound passed."""
    if world_size() < 2:
        return True
    try:
        from datetime import timedelta

        import torch.distributed as dist

        bound = timedelta(seconds=limit_s)
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=bound)  # env:// from the launcher
        group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        dist.monitored_barrier(group=group, timeout=bound, wait_all_ranks=True)
        return True
    except Exception as exc:
        log(f"ranks did not all meet after the failure: {exc!r}")
        return False


def finish(verdict: str, result: dict, barrier: bool = True) -> None:
    """Rank 0 writes the result; all ranks meet; every rank exits with the verdict's code.

    barrier=False is for failures, where a peer may be dead or stuck in a collective: the
    ranks meet with a bounded barrier instead (_meet_after_failure); where that fails, rank 0
    exits and the other ranks wait (bounded) for its file.
    """
    result["verdict"] = verdict
    result["wall_time_s"] = round(time.time() - T_START, 2)
    result["env"] = {k: os.environ.get(k) for k in RECORDED_ENV}
    if rank() == 0:
        write_result(result)
        log(f"verdict: {verdict} - {result.get('reason', '')}")
    if barrier:
        try:
            dist = _ensure_process_group()
            if dist is not None:
                dist.barrier()
                dist.destroy_process_group()
        except Exception as exc:  # a peer already died: still exit with our own code
            log(f"barrier failed: {exc!r}")
    elif not _meet_after_failure() and rank() != 0:
        _wait_for_rank0_result()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT[verdict])  # skip atexit hooks that could hang on a torn-down group


def imported_versions() -> dict:
    out = {}
    for name in PACKAGES:
        mod = sys.modules.get(name)
        out[name] = getattr(mod, "__version__", None) if mod is not None else dist_version(name)
    return out


def one_line(exc: BaseException) -> str:
    """'Type: message' on one line, with the root cause of a chained exception appended."""
    text = f"{type(exc).__name__}: {exc}"
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    if root is not exc:
        text += f" <- {type(root).__name__}: {root}"
    return " ".join(text.split())


# Missing modules that mean "this host cannot run this version set", each with the reason.
# Any other ImportError is an error: a broken environment must never read as a skip.
MISSING_MODULES = {
    "oneccl_bindings_for_pytorch": "deepspeed < 0.14.1 imports Intel's oneCCL bindings "
    "unconditionally on CPU (CPU hosts need deepspeed >= 0.14.1)",
}
# Where torch's C++-extension build raises (DeepSpeed JIT-builds deepspeed_shm_comm on CPU).
BUILD_SOURCES = ("torch/utils/cpp_extension.py", "op_builder/")
BUILD_MESSAGES = ("error building extension", "ninja is required to load c++ extensions")
# huggingface_hub's own words for "the hub is not reachable" (only --hub needs the hub).
HUB_UNREACHABLE = ("we couldn't connect to 'https://huggingface.co'", "offline mode is enabled")


def raised_in(exc: BaseException, *places: str) -> bool:
    """Whether the exception came out of one of these source files (any frame)."""
    tb = exc.__traceback__
    while tb is not None:
        if any(place in tb.tb_frame.f_code.co_filename for place in places):
            return True
        tb = tb.tb_next
    return False


def chain(exc: BaseException) -> list[BaseException]:
    """The exception and what it was explicitly raised from (`raise ... from`), no cycles. Not
    the implicit context: an error raised while handling a missing module (say, in the code
    that falls back without it) is not caused by the missing module."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__
    return seen


def missing_build_tools() -> list[str]:
    """The tools torch's extension build runs that are not on PATH: the compiler ($CXX, else
    c++, as torch.utils.cpp_extension picks it) and ninja. Evidence, not a guess from a message:
    a build failure is only "cannot test here" when one of these is really absent."""
    import shlex
    import shutil

    compiler = os.environ.get("CXX") or "c++"
    missing = []
    words = shlex.split(compiler) or ["c++"]
    if shutil.which(words[0]) is None:
        where = " ($CXX)" if os.environ.get("CXX") else ""
        missing.append(f"C++ compiler {words[0]!r}{where}")
    if shutil.which("ninja") is None:
        missing.append("ninja")
    return missing


def classify_exception(
    exc: BaseException, missing_tools: list[str] | tuple[str, ...] = (), hub: bool = False
) -> str | None:
    """A one-line cannot_test reason when the failure is a known "cannot run here", else None
    (an error). Known: a module of MISSING_MODULES is absent; the C++ op build failed while
    a tool it needs is missing (`missing_tools`, from missing_build_tools()); with --hub, the
    hub is unreachable. Anything else, a real build error included, is an error."""
    text = one_line(exc)
    for link in chain(exc):
        name = getattr(link, "name", None) if isinstance(link, ModuleNotFoundError) else None
        top = name.split(".")[0] if name else None
        if top in MISSING_MODULES:
            return f"{MISSING_MODULES[top]}: {text[:300]}"
    low = text.lower()
    build = raised_in(exc, *BUILD_SOURCES) or any(m in low for m in BUILD_MESSAGES)
    if build and missing_tools:
        return (
            f"DeepSpeed could not build its C++ op: {', '.join(missing_tools)} not found "
            f"(install g++ and ninja): {text[:300]}"
        )
    if hub and any(m in low for m in HUB_UNREACHABLE):
        return f"--hub needs the Hugging Face hub, which is not reachable here: {text[:200]}"
    return None


# --------------------------------------------------------------------------------------------
# verdict from the per-rank measurements
# --------------------------------------------------------------------------------------------
def summarize(per_rank: list[dict], criterion: str = "step0") -> tuple[str, dict, str]:
    max_diff = max(r["max_abs_logp_diff"] for r in per_rank)
    max_kl = max(abs(r["objective_kl_step0"]) for r in per_rank)
    metrics = {
        "max_abs_logp_diff": max_diff,
        "max_abs_kl_step0": max_kl,
        "max_abs_local_kl_step0": max(abs(r["local_kl_step0"]) for r in per_rank),
        "ranks_with_negative_kl_step0": sum(r["objective_kl_step0"] < 0 for r in per_rank),
        "max_abs_forward_probe_logp_diff": max(
            r["forward_probe_max_abs_logp_diff"] for r in per_rank
        ),
    }
    if criterion == "forward-probe":
        reproduced = metrics["max_abs_forward_probe_logp_diff"] > THRESHOLD
    else:
        reproduced = max_diff > THRESHOLD or max_kl > 0.0
    kls = " / ".join(f"{r['objective_kl_step0']:+.6f}" for r in per_rank)
    dtypes = ", ".join(
        sorted({f"policy {r['policy_dtype']} vs ref {r['ref_dtype']}" for r in per_rank})
    )
    reason = (
        f"step 0: max |logp - ref_logp| = {max_diff:.3g} (threshold {THRESHOLD:g}), "
        f"objective/kl per rank = {kls}; {dtypes}; same-input forward probe "
        f"{metrics['max_abs_forward_probe_logp_diff']:.3g}"
    )
    return ("reproduced" if reproduced else "clean"), metrics, reason


def kl_stats(values: list[float]) -> dict:
    """n, mean, standard error (sample sd / sqrt n), fraction negative and z = mean / SE of
    per-sequence KLs. Non-finite values are an error: a NaN would make every figure a lie."""
    import math

    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{len(bad)} of {len(values)} per-sequence KLs are not finite ({bad[0]})")
    n = len(values)
    if n == 0:
        raise ValueError("no per-sequence KL was measured")
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n)
    if se > 0:
        z = max(-Z_CAP, min(Z_CAP, mean / se))
    else:
        z = 0.0 if mean == 0 or n < 2 else math.copysign(Z_CAP, mean)
    return {
        "n": n,
        "mean": mean,
        "se": se,
        "fraction_negative": sum(v < 0 for v in values) / n,
        "z": z,
    }


def t_two_sided(t: float, df: int) -> float:
    """P(|T| > t) for Student's t with integer df, in closed form (Abramowitz & Stegun
    26.7.3-4): the repro carries its own, it imports nothing of the harness."""
    import math

    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        term, total = c, c if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= (k - 1) / k * c * c
            total += term
        inside = 2 / math.pi * (theta + s * total)
    else:
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= (k - 1) / k * c * c
            total += term
        inside = s * total
    return max(0.0, 1.0 - inside)


def t_critical(batches: int) -> float:
    """Student's t critical value at two-sided BATCH_ALPHA, df = batches - 1."""
    lo, hi = 0.0, 1e4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, batches - 1) > BATCH_ALPHA else (lo, mid)
    return hi


def batch_critical(batches: int) -> float:
    """The |t| the seed batches' means must pass: t's critical value, and never below
    Z_THRESHOLD (with many batches t's is under 3.0; the bar is not lowered)."""
    return max(Z_THRESHOLD, t_critical(batches))


def summarize_signed(per_rank: list[dict]) -> tuple[str, dict, str, dict]:
    """The signed step-0 KL per rank and pooled, and what these numbers allow one to say.

    Each rank gives ``kl_per_sequence`` (every sequence's step-0 KL) and
    ``objective_kl_per_seed`` (trl's objective/kl of each seed's batch: its mean).
    "systematically negative" (verdict reproduced: the sign trl#506 reported) or
    "systematically positive" (clean) only when the pooled |z| > Z_THRESHOLD, the z over the
    seed batches' means agrees (same sign, past the threshold), every rank's mean has that
    sign, every rank has >= MIN_PER_RANK sequences and there are >= MIN_BATCHES batches;
    otherwise the sign is not told apart from noise (clean). The metric
    ``signed_kl_negative_z`` carries the decision for repro.toml's rule: the pooled -z when
    those conditions hold for a negative sign, else 0."""
    ranks = sorted(per_rank, key=lambda r: r["rank"])
    rows = []
    for r in ranks:
        rows.append({"group": f"rank {r['rank']}", **kl_stats(list(r["kl_per_sequence"]))})
    pooled = {"group": "all", **kl_stats([v for r in ranks for v in r["kl_per_sequence"]])}
    batch_means = [float(v) for r in ranks for v in r.get("objective_kl_per_seed", [])]
    batches = kl_stats(batch_means) if batch_means else {"n": 0, "z": 0.0}
    z, z_batches = pooled["z"], batches["z"]
    signs = {(row["mean"] > 0) - (row["mean"] < 0) for row in rows}
    few = [row["group"] for row in rows if row["n"] < MIN_PER_RANK]
    per_rank_z = ", ".join(f"{row['group']} z = {row['z']:+.2f}" for row in rows)
    per_rank_z += f"; over the {batches['n']} seed batches' means z = {z_batches:+.2f}"
    if pooled["se"] == 0 and pooled["mean"] == 0:
        conclusion, sign = "the KL is exactly 0 on every sequence: no sign to speak of", 0
    elif few or batches["n"] < MIN_BATCHES:
        what = [f"{g} below {MIN_PER_RANK} sequences" for g in few]
        if batches["n"] < MIN_BATCHES:
            what.append(f"{batches['n']} seed batches, below {MIN_BATCHES}")
        conclusion, sign = (
            f"too few to tell a sign ({', '.join(what)}; pooled z = {z:+.2f})",
            0,
        )
    elif abs(z) <= Z_THRESHOLD:
        conclusion, sign = (
            f"the sign is noise at this sample size (pooled z = {z:+.2f}, "
            f"|z| <= {Z_THRESHOLD:g}; {per_rank_z})",
            0,
        )
    elif len(signs) > 1:
        conclusion, sign = (
            f"no systematic sign: the pooled z = {z:+.2f} but the ranks disagree in sign "
            f"({per_rank_z})",
            0,
        )
    elif abs(z_batches) <= batch_critical(batches["n"]) or (z_batches > 0) != (z > 0):
        conclusion, sign = (
            f"no systematic sign: the pooled z = {z:+.2f} but the seed batches' means do not "
            f"bear it out (|t| <= {batch_critical(batches['n']):.2f}, two-sided <= "
            f"{BATCH_ALPHA:g} at {batches['n'] - 1} df; {per_rank_z})",
            0,
        )
    else:
        sign = -1 if z < 0 else 1
        word = "negative" if sign < 0 else "positive"
        conclusion = (
            f"systematically {word} (pooled z = {z:+.2f}, |z| > {Z_THRESHOLD:g}, every rank "
            f"{word}, the seed batches' |t| > {batch_critical(batches['n']):.2f}; {per_rank_z})"
        )
    metrics = {
        "signed_kl_negative_z": -z if sign < 0 else 0.0,
        "signed_kl_z": z,
        "signed_kl_n": float(pooled["n"]),
        "signed_kl_mean": pooled["mean"],
        # the mean with its sign turned, so "above 0" is the sign trl#506 reported: what the
        # repeated launches' t-test reads (repro.toml)
        "signed_kl_negative_mean": -pooled["mean"],
        "signed_kl_se": pooled["se"],
        "signed_kl_fraction_negative": pooled["fraction_negative"],
        "signed_kl_systematic": float(sign),
        "signed_kl_z_seed_batches": float(z_batches),
        "max_abs_logp_diff": max(r["max_abs_logp_diff"] for r in ranks),
    }
    for row, r in zip(rows, ranks, strict=True):
        for key in ("n", "mean", "se", "fraction_negative", "z"):
            metrics[f"signed_kl_{key}_rank{r['rank']}"] = float(row[key])
    figures = "; ".join(
        f"{row['group']}: n = {row['n']}, mean {row['mean']:+.6f} +- {row['se']:.6f}, "
        f"{row['fraction_negative']:.1%} negative"
        for row in [*rows, pooled]
    )
    reason = f"signed step-0 KL per sequence: {conclusion}. {figures}"
    measurement = {
        "name": "signed step-0 KL per sequence (trl's objective/kl averages it)",
        "rows": [*rows, pooled],
        "conclusion": conclusion,
        "z_threshold": Z_THRESHOLD,
        "min_per_rank": MIN_PER_RANK,
        "z_seed_batches": z_batches,
        "seed_batches": batches["n"],
        "objective_kl_per_seed": {
            f"rank {r['rank']}": list(r.get("objective_kl_per_seed", [])) for r in ranks
        },
    }
    verdict = "reproduced" if metrics["signed_kl_negative_z"] > Z_THRESHOLD else "clean"
    return verdict, metrics, reason, measurement


def main(argv=None) -> None:
    args = parse_args(argv)
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": None,
        "reason": "",
        "metrics": {},
        "ranks": [],
        "series": {},
        "versions": {},
        "device": None,
        "backend": None,
        "world_size": world_size(),
        "seed": args.seed,
        "python": platform.python_version(),
        "fix": args.fix,
        "options": {
            "hub": args.hub,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens,
            "bf16_via": args.bf16_via,
            "api": args.api,
            "criterion": args.criterion,
            "seeds": args.seeds,
        },
    }
    try:
        pre = preflight(args)
    except CannotTest as exc:
        result["versions"] = {n: dist_version(n) for n in PACKAGES}
        result["reason"] = str(exc)
        finish("cannot_test", result)
    result["generation"] = pre["generation"]
    if args.preflight:
        # The tiny model is built here (once; cached on disk), in one plain process with its
        # own timeout, so the ranks only load it: a first build on a loaded 2-core host took
        # longer than a launch's whole timeout while the other rank waited on its lock.
        if not args.hub:
            from common import model_path

            model_path(args, log)
        sys.exit(0)

    try:
        fix_note = None
        if args.fix:
            fix_mod = importlib.import_module(args.fix)
            fix_note = fix_mod.apply() if hasattr(fix_mod, "apply") else "imported (no apply())"
            log(f"fix {args.fix}: {fix_note}")
        result["fix_note"] = fix_note
        if not pre["cuda"]:
            build_ops_first(log)
        adapter = importlib.import_module(
            {"old": "gen_old", "trainer": "gen_trainer", "experimental": "gen_experimental"}[
                pre["generation"]
            ]
        )
        measured = adapter.run(args, log)
    except CannotTest as exc:
        result["versions"] = imported_versions()
        result["reason"] = str(exc)
        finish("cannot_test", result)
    except Exception as exc:
        traceback.print_exc()
        result["versions"] = imported_versions()
        why = classify_exception(exc, missing_build_tools(), hub=args.hub)
        if why:
            result["reason"] = why
            finish("cannot_test", result, barrier=False)
        result["reason"] = f"error: {one_line(exc)[:400]}"
        finish("error", result, barrier=False)

    try:
        per_rank = gather(measured["rank"])
        result.update(measured["run"])
        result["versions"] = imported_versions()
        result["ranks"] = per_rank
        if args.criterion == "signed-kl":
            verdict, metrics, reason, measurement = summarize_signed(per_rank)
            result.update(metrics=metrics, reason=reason, measurement=measurement)
        else:
            for r in per_rank:
                result["series"][f"kl_rank{r['rank']}"] = r.pop("objective_kl_series")
                result["series"][f"local_kl_rank{r['rank']}"] = r.pop("local_kl_series")
            verdict, result["metrics"], result["reason"] = summarize(per_rank, args.criterion)
    except Exception as exc:  # e.g. a peer died before the gather
        traceback.print_exc()
        result["reason"] = f"error: {one_line(exc)[:400]}"
        finish("error", result, barrier=False)
    finish(verdict, result)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # never let a crash exit 1, which would read as "reproduced"
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT["error"])
