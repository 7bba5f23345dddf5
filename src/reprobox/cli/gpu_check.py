"""The `gpu-check` command (`nox -s gpu_check`): the prepared check for a one-GPU host that has
its own CUDA torch and no network.

It first makes sure there is a GPU (nvidia-smi lists one and the host's torch sees it); with
none it stops at once, exit 125, one line saying "no GPU": a CPU host must never pass for a
GPU result. Then it runs, each through `reprobox run --platform gpu` with the host's torch
(`REPROBOX_TORCH_SOURCE=host`) and the wheelhouse (`REPROBOX_WHEELHOUSE`), kl's 1-GPU broken
and fixed pair and its signed-KL measurement, and lm_head's default variants (4 ranks: over
gloo, or cannot-test on one GPU), each under a wall-clock cap, the caps summing under the
budget (8 minutes). One JSON holds the host's facts and each cell's verdict, status, exit
codes, metrics and times; only records written by this check are read, so a stale verdict of
an earlier run is never reported as this host's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reprobox.cli import options, ui
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode, ReproboxError
from reprobox.core.files import atomic_write
from reprobox.core.judge import Status
from reprobox.core.processes import signal_group
from reprobox.core.protocol import Verdict
from reprobox.core.records import RecordStore, utc_now
from reprobox.run import interrupts
from reprobox.run.backends import registry as backends

BUDGET_S = 480.0  # the whole check, GPU probe included
PROBE_S = 30.0  # kept for probing the host (nvidia-smi, importing torch)
GRACE_S = 20.0  # a cell past its cap is sent SIGTERM (ranks killed, recorded), then killed


PLAN_FILE = Path("repros") / "gpu_check.toml"  # under the root: the cells, in order


class PlannedCell(BaseModel):
    """One `reprobox run` of the check: a repro, its variants (empty: the defaults), its cap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repro: str
    variants: tuple[str, ...] = ()
    share: float = Field(gt=0, le=1)  # of the budget left after the probe
    why: str
    may_not_test: bool = False  # cannot-test (with its reason) is an answer, not a failure
    # where it runs: a kind of the registry (the venv with the host's torch, by default; a
    # container runs its image's own torch, its GPUs passed as the engine passes them)
    backend: str = "venv"
    args: tuple[str, ...] = ()  # more flags of `reprobox run` (--engine, --container-image)

    @field_validator("backend")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in backends.NAMES:
            raise ValueError(f"backend {value!r}: want one of {', '.join(backends.NAMES)}")
        return value

    def cap(self, budget: float) -> float:
        """The cell's cap when every cell before it uses its whole cap (the least it gets)."""
        return round((budget - PROBE_S - GRACE_S) * self.share, 1)


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cell: list[PlannedCell] = Field(min_length=1)


def load_plan(root: Path, path: Path | None = None) -> tuple[PlannedCell, ...]:
    """The check's cells from `repros/gpu_check.toml` (or `path`, `--plan`; the harness names
    no repro itself): a missing or malformed plan, or shares that do not sum to 1, is bad
    input."""
    path = path or root / PLAN_FILE
    try:
        plan = Plan.model_validate(tomllib.loads(path.read_text()))
    except OSError as exc:
        raise BadInput(f"gpu-check: cannot read its plan {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        first = str(exc).strip().splitlines()
        raise BadInput(f"gpu-check: {path} is not a plan: {' '.join(first[:3])}") from None
    total = sum(cell.share for cell in plan.cell)
    if abs(total - 1.0) > 1e-6:
        raise BadInput(f"gpu-check: the shares in {path} sum to {total:g}, not 1")
    return tuple(plan.cell)


@dataclass
class HostFacts:
    """What the host is: its GPUs (nvidia-smi) and its torch (the host Python)."""

    gpus: list[dict[str, str]] = field(default_factory=list)
    host_python: str = ""
    torch: dict[str, Any] = field(default_factory=dict)
    problem: str = ""  # why this is not a GPU host ("no GPU ..."), empty when it is


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpu-check` to the `reprobox` parser."""
    parser = subparsers.add_parser(
        "gpu-check",
        help="the prepared check of a one-GPU host: kl's 1-GPU pair and signed KL, lm_head",
    )
    options.add(parser, "wheelhouse")
    parser.add_argument(
        "--plan", type=Path, help="the plan to run (default: repros/gpu_check.toml; "
        "repros/gpu_check_containers.toml: the same host's GPUs in containers)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=Path("gpu-check.json"), help="the JSON to write"
    )
    parser.add_argument(
        "--budget", type=float, default=BUDGET_S, help="seconds for the whole check (480)"
    )
    parser.add_argument(
        "--dry-run", action="store_true",
        help="print the plan (cells, caps, wheelhouse) and the GPU probe; run nothing",
    )  # fmt: skip
    parser.set_defaults(handler=cmd_gpu_check)


def host_python(name: str) -> str:
    """The interpreter whose torch the cells use (REPROBOX_HOST_PYTHON, default python3), as
    a path where PATH has it (the JSON says which one ran)."""
    return shutil.which(name) or name


TORCH_PROBE = (
    "import json, torch; ok = torch.cuda.is_available(); print(json.dumps({"
    "'version': torch.__version__, 'cuda': torch.version.cuda, 'available': ok, "
    "'devices': torch.cuda.device_count() if ok else 0, "
    "'name': torch.cuda.get_device_name(0) if ok else None, "
    "'capability': '.'.join(map(str, torch.cuda.get_device_capability(0))) if ok else None, "
    "'archs': torch.cuda.get_arch_list() if ok else [], "
    "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if ok else None}))"
)


def probe_host(python: str) -> HostFacts:
    """nvidia-smi's GPUs, then the host torch's view of them; `problem` says which is missing."""
    facts = HostFacts(host_python=python)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        facts.problem = "no GPU: nvidia-smi is not on PATH (no NVIDIA driver on this host)"
        return facts
    query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        facts.problem = f"no GPU: nvidia-smi failed ({exc})"
        return facts
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        name, _, rest = line.partition(",")
        driver, _, memory = rest.partition(",")
        facts.gpus.append({"name": name.strip(), "driver": driver.strip(),
                           "memory": memory.strip()})  # fmt: skip
    if not facts.gpus:
        why = (listed.stderr or listed.stdout).strip().splitlines()[-1:] or ["lists none"]
        facts.problem = f"no GPU: nvidia-smi found none ({why[0]})"
        return facts
    try:
        torch = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True,
                               timeout=120)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        facts.problem = f"no GPU usable: the host Python {python} did not start ({exc})"
        return facts
    if torch.returncode != 0:
        last = (torch.stderr.strip().splitlines() or ["no message"])[-1]
        facts.problem = f"no GPU usable: the host Python {python} cannot import torch ({last})"
        return facts
    facts.torch = json.loads(torch.stdout.strip().splitlines()[-1])
    if not facts.torch.get("available"):
        facts.problem = (
            f"no GPU visible to the host's torch {facts.torch.get('version')} "
            f"(torch.cuda.is_available() is False; CUDA {facts.torch.get('cuda')})"
        )
    return facts


def wheelhouse_summary(path: Path | None) -> dict[str, Any]:
    """What the wheelhouse holds (files, MiB, the sdists built at install, the largest), or
    that installs use the index."""
    if path is None:
        return {"path": None, "files": 0, "mib": 0.0, "sdists": [], "largest": []}
    if not path.is_dir():
        raise BadInput(f"--wheelhouse {path}: no such folder")
    files = sorted((p for p in path.iterdir() if p.is_file()), key=lambda p: -p.stat().st_size)
    size = sum(p.stat().st_size for p in files)
    return {
        "path": str(path), "files": len(files), "mib": round(size / 2**20, 1),
        "sdists": sorted(p.name for p in files if not p.name.endswith(".whl")),
        "largest": [f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in files[:3]],
    }  # fmt: skip


def check_plan(root: Path, plan: tuple[PlannedCell, ...]) -> None:
    """Every planned variant exists and runs on platform gpu (a stale plan: one line)."""

    for cell in plan:
        repro = spec.load(root, cell.repro)
        repro.platform("gpu")
        for variant in cell.variants:
            repro.variant(variant)
            if variant not in repro.variants_on("gpu"):
                raise BadInput(f"gpu-check: {cell.repro} {variant} does not run on platform gpu")


def last_error(log: Path) -> str:
    """The harness's one `reprobox: error:` line of a cell's log (its reason), if any."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line for line in lines if "reprobox: error:" in line]
    return errors[-1].split("reprobox: error:", 1)[1].strip() if errors else ""


def run_cell(
    cell: PlannedCell, cap: float, env: dict[str, str], logs: Path
) -> tuple[int, float, Path]:
    """`reprobox run` of one planned cell under `cap` seconds of wall time: (exit, wall, log).
    Past the cap it is terminated as a cancelled job is (its ranks are killed and the cell is
    recorded as interrupted), then killed after a grace."""
    where = "" if cell.backend == "venv" else f"{cell.backend}-"
    log = logs / f"{cell.repro}-{where}{'-'.join(cell.variants) or 'default'}.log"
    argv = [sys.executable, "-m", "reprobox", *cell_argv(cell, cap)]
    if cell.backend == "container":  # an image runs its own torch, never the host's
        env = {k: v for k, v in env.items() if k not in HOST_TORCH_ENV}
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=max(0.0, cap))
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = int(ExitCode.TIMEOUT)
        except BaseException:  # Ctrl-C, SIGTERM: the run (its own session) is stopped too
            with interrupts.shielded(raise_pending=False):
                _stop(proc)
            raise
    return code, round(time.monotonic() - started, 1), log


HOST_TORCH_ENV = ("REPROBOX_TORCH_SOURCE", "REPROBOX_HOST_PYTHON")


def cell_argv(cell: PlannedCell, cap: float) -> list[str]:
    """The `reprobox` arguments of one planned cell under `cap` seconds."""
    argv = ["run", cell.repro, "--platform", "gpu", "--timeout", str(max(10, int(cap - 5)))]
    for variant in cell.variants:
        argv += ["--variant", variant]
    if cell.backend != "venv":
        argv += ["--backend", cell.backend]
    return [*argv, *cell.args]


def gpu_passing(cell: PlannedCell) -> str:
    """How a cell's launch reaches the GPUs, in words (the dry run says it)."""
    if cell.backend == "container":
        # start-up cost: a container engine's module, for a gpu check only
        from reprobox.run.backends.engine import Engine

        docker, podman = Engine("docker").gpu_flags(), Engine("podman").gpu_flags()
        return f"docker {' '.join(docker)}, podman {' '.join(podman)} (CDI)"
    if cell.backend == "slurm":
        return "the job's --gres; with --container-image, pyxis/enroot's image"
    return "the host's torch"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run (it kills its ranks and records the cell as interrupted); what is
    left after the grace is killed, its whole session."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)  # not once it is reaped: its id may be another's
    proc.wait()


def cell_results(
    repro: str, variants: tuple[str, ...], since: str, results: Path
) -> list[dict[str, Any]]:
    """The gpu records of `repro` this check wrote (started at or after `since`), as JSON."""

    found = []
    for record in RecordStore(results).latest(repro):
        if record.platform != "gpu" or record.started_at < since:
            continue
        if variants and record.variant not in variants:
            continue
        measured = record.result.get("measurement") or {}
        found.append({
            "variant": record.variant, "expect": record.expect, "verdict": record.verdict,
            "status": record.status, "exit_code": record.exit_code, "reason": record.reason,
            "metrics": record.metrics, "decided_by": record.decided_by,
            # kl's signed KL: per-rank and pooled n, mean, SE, fraction negative, and what
            # those numbers allow (the script's own conclusion)
            "conclusion": measured.get("conclusion"), "rows": measured.get("rows", []),
            "torch_source": record.torch_source,
            "wall_s": record.wall_s, "env_s": record.env_s, "dir": record.dir,
        })  # fmt: skip
    return found


def _answered(cell: dict[str, Any], record: dict[str, Any]) -> bool:
    """A record that is an answer: its expected (or recorded) verdict, or, where the plan
    allows it, cannot-test with its reason."""
    if record.get("status") in (Status.MATCH, Status.RECORDED):
        return True
    cannot = record.get("verdict") == Verdict.CANNOT_TEST or record.get("exit_code") == 125
    return bool(cell.get("may_not_test")) and cannot


def check_exit(cells: list[dict[str, Any]]) -> int:
    """0 when every cell gave its expected (or recorded) verdict, or, where the plan allows it
    (lm_head's 4 ranks on one GPU), could not be tested for a stated reason; 1 when a verdict
    differs (a kl cell that cannot test is not excused: it has not answered); else the first
    failing cell's harness code."""
    failed = [(c, [r for r in c["records"] if not _answered(c, r)]) for c in cells]
    if any(r.get("status") == Status.MISMATCH for _, bad in failed for r in bad):
        return int(ExitCode.FAILED)
    for cell, bad in failed:
        allowed = (0, 1, int(ExitCode.CANNOT_TEST)) if cell.get("may_not_test") else (0,)
        if bad or not cell["records"] or cell["exit"] not in allowed:
            return int(cell["exit"]) or int(ExitCode.RUN_FAILED)
    return int(ExitCode.OK)


def run_plan(
    plan: tuple[PlannedCell, ...],
    deadline: float,
    env: dict[str, str],
    logs: Path,
    since: str,
    results: Path,
) -> list[dict[str, Any]]:
    """Each planned cell under its cap, its share of the time left before `deadline` (a
    monotonic time), and what it left: exit, wall time, log, its records, the harness's
    reason."""
    cells: list[dict[str, Any]] = []
    for i, cell in enumerate(plan):
        # this cell's share of what is left: time an earlier cell did not use goes to the rest
        cap = (deadline - time.monotonic()) * cell.share / sum(c.share for c in plan[i:])
        entry: dict[str, Any] = {"repro": cell.repro, "variants": list(cell.variants),
                                 "why": cell.why, "cap_s": round(cap, 1),
                                 "may_not_test": cell.may_not_test}  # fmt: skip
        if cap < 10:
            entry.update(exit=int(ExitCode.TIMEOUT), wall_s=0.0, records=[],
                         reason="not started: the check's budget was spent")  # fmt: skip
        else:
            ui.info(f"gpu-check: {cell.repro} {' '.join(cell.variants) or 'defaults'} "
                    f"(cap {cap:.0f} s)")  # fmt: skip
            code, wall, log = run_cell(cell, cap, env, logs)
            records = cell_results(cell.repro, cell.variants, since, results)
            entry.update(exit=code, wall_s=wall, log=str(log), records=records,
                         reason=last_error(log))  # fmt: skip
        cells.append(entry)
    return cells


def cmd_gpu_check(args: argparse.Namespace) -> int:
    settings = options.settings(args)
    started = time.monotonic()
    wheelhouse = args.wheelhouse or settings.wheelhouse
    house = wheelhouse_summary(wheelhouse.resolve() if wheelhouse else None)
    python = host_python(settings.host_python)
    if args.budget <= PROBE_S:
        raise BadInput(f"--budget {args.budget}: more than {PROBE_S:.0f} s is needed")
    plan = load_plan(settings.root, args.plan)
    if args.dry_run:
        check_plan(settings.root, plan)
        for cell in plan:
            what = ", ".join(cell.variants) or "default variants"
            cap = cell.cap(args.budget)
            ui.info(
                f"gpu-check plan: {cell.repro} {what}: cap >= {cap} s ({cell.why}); "
                f"reprobox {' '.join(cell_argv(cell, cap))}; GPUs: {gpu_passing(cell)}"
            )
        shown = "none (installs ask the index)"
        if house["path"]:
            sdists = ", ".join(house["sdists"]) or "none"
            shown = (f"{house['path']}: {house['files']} files, {house['mib']} MiB, sdists "
                     f"{sdists}; largest {', '.join(house['largest'])}")  # fmt: skip
        ui.info(f"gpu-check plan: budget {args.budget:.0f} s; host Python {python}; "
                f"JSON to {args.out}; wheelhouse {shown}")  # fmt: skip
    facts = probe_host(python)
    if facts.problem:
        if args.dry_run:
            ui.info(f"gpu-check: {facts.problem}; the check itself would stop here")
            return int(ExitCode.OK)
        raise ReproboxError(f"gpu-check: {facts.problem}", exit_code=ExitCode.CANNOT_TEST)
    if args.dry_run:
        ui.info(f"gpu-check: GPU {facts.gpus[0]['name']}, torch {facts.torch.get('version')}")
        return int(ExitCode.OK)
    env = {**os.environ, "REPROBOX_TORCH_SOURCE": "host", "REPROBOX_HOST_PYTHON": python}
    if house["path"]:
        env["REPROBOX_WHEELHOUSE"] = house["path"]
    check_plan(settings.root, plan)

    since = utc_now()  # the records' own clock format: a later record compares greater
    logs = args.out.resolve().parent / f"{args.out.stem}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    # a cell stopped at its cap may take GRACE_S more to end: the last one must end in time
    deadline = started + args.budget - GRACE_S
    cells = run_plan(plan, deadline, env, logs, since, settings.results)
    report = {
        "schema": 1, "started_at": since, "budget_s": args.budget,
        "wall_s": round(time.monotonic() - started, 1),
        "host": asdict(facts), "wheelhouse": house, "cells": cells,
    }  # fmt: skip
    code = check_exit(cells)
    report["exit"] = code

    atomic_write(args.out, json.dumps(report, indent=2) + "\n")
    for done in cells:
        shown = ", ".join(f"{r['variant']} {r['verdict']} ({r['status']})" for r in done["records"])
        ui.info(f"gpu-check: {done['repro']}: exit {done['exit']}, {done['wall_s']} s: "
                f"{shown or done['reason'] or 'no record'}")  # fmt: skip
    ui.info(f"gpu-check: {report['wall_s']} s in all; JSON in {args.out}")
    return code
