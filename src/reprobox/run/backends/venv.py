"""The local back end: a uv venv per lock, ranks started by the repro's own launcher."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reprobox.core import env_filter
from reprobox.core.cells import Cell
from reprobox.core.judge import Launched
from reprobox.core.protocol import CACHE_ENV, PLAN_ENV, RESULT_ENV
from reprobox.core.settings import Settings, repro_cache
from reprobox.core.spec import Repro
from reprobox.envs import venvs
from reprobox.run import devices, launcher, multinode, sitehook
from reprobox.run.backend import (
    PLAN_FILE,
    PREFLIGHT_LOG,
    Handle,
    LaunchRequest,
    Prepared,
    plan_text,
)
from reprobox.run.exits import last_error, launcher_exits, rank_exits
from reprobox.run.installs import ensure_env


def venv_of(handle: Handle) -> venvs.Env:
    """The venv a venv back end prepared (a handle of another back end is a harness bug)."""
    if not isinstance(handle, venvs.Env):
        raise TypeError(f"not a venv: {type(handle).__name__}")
    return handle


class VenvBackend:
    """Runs launches on this machine, in the venv built from each lock."""

    name = "venv"

    def __init__(self, settings: Settings, gpus: int | None = None) -> None:
        self.settings = settings
        self.gpus = gpus  # this host's GPUs (None: count them with nvidia-smi)

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        started = time.monotonic()
        # Too few GPUs is "cannot test here" (125), found before a 3 GB install, not a crash.
        devices.require(repro, cell.variant, cell.platform, self.gpus)
        env = ensure_env(repro, lock, cell.platform, settings=self.settings)
        return Prepared(
            key=str(env.path),
            lock=lock,
            lock_hash=env.lock_hash,
            runner=f"venv (rebuilt: {env.repaired})" if env.repaired else "venv",
            torch_source=env.torch_source,
            env_s=time.monotonic() - started,
            handle=env,
        )

    def plan(self, prepared: Prepared, request: LaunchRequest) -> launcher.LaunchPlan:
        """The launcher plan: the repro's launcher, or one plain process for a preflight."""
        env = venv_of(prepared.handle)
        spec, lead = request.launch, request.lead
        cache = str(repro_cache(self.settings, request.repro.name))
        protocol = {RESULT_ENV: str(lead.result)}
        args = list(lead.args)
        if len(request.cases) > 1 and request.preflight is None:
            plan_file = lead.run_dir / PLAN_FILE
            plan_file.write_text(plan_text(request, [str(c.result) for c in request.cases]))
            protocol, args = {PLAN_ENV: str(plan_file)}, []
        run_env = {
            **env_filter.for_launch(os.environ, spec.pass_env),  # never the harness's secrets
            CACHE_ENV: cache,
            **spec.env,
            **protocol,
            # fixes/ first; then the harness's sitecustomize (the files read, stacks on a hang)
            "PYTHONPATH": os.pathsep.join(
                [str(request.repro.fixes_dir), str(sitehook.hook_dir(self.settings.cache))]
            ),
            **sitehook.launch_env(lead.run_dir, [request.repro.dir, request.repro.fixes_dir]),
            "PATH": os.pathsep.join([str(env.path / "bin"), os.environ.get("PATH", "")]),
            "VIRTUAL_ENV": str(env.path),
        }
        plan = launcher.LaunchPlan(
            launcher=spec.launcher,
            bin_dir=env.path / "bin",
            processes=spec.processes,
            script=request.repro.script,
            script_args=args,
            timeout=request.timeout,
            log_dir=lead.run_dir,
            cwd=lead.run_dir,
            env=run_env,
            launcher_args=spec.args,
            config=(request.repro.dir / spec.config) if spec.config else None,
            port=launcher.free_port(),
            registry=self.settings.cache / "runs",
            nodes=spec.nodes,
            fork=tuple(spec.fork) if spec.launcher == "python" else (),
        )
        if request.preflight is not None:
            return launcher.one_process(plan, request.preflight, PREFLIGHT_LOG)
        return plan

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return self.plan(prepared, request).argv()

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The names of the variables the launched processes start with (for the record)."""
        plan = self.plan(prepared, request)
        names = set(launcher.child_env(plan.env)) | {launcher.RUN_ID_ENV}
        names |= {"MASTER_ADDR", "MASTER_PORT"}
        if multinode.harness_ranks(plan.launcher, plan.processes, plan.nodes):
            names |= {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}
        return sorted(names)

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        plan = self.plan(prepared, request)
        outcome = launcher.run(plan, echo=request.echo)
        harness_ranks = multinode.harness_ranks(plan.launcher, plan.processes, plan.nodes)
        if harness_ranks:
            exits = rank_exits(outcome.codes)
        else:
            exits = launcher_exits(outcome.returncode, outcome.log)
        return Launched(
            exits=() if outcome.timed_out else exits,
            timed_out=outcome.timed_out,
            timeout=plan.timeout,
            wall_s=outcome.wall_s,
            logs=request.lead.run_dir,
            last_error=last_error([outcome.log, *outcome.rank_logs]),
            launcher_stops_peers=not harness_ranks,
            stopped=_stopped(outcome.stacks),
        )


def _stopped(stacks: tuple[Path, ...]) -> str:
    """What was done to a launch past its timeout, and where its stacks are, if any."""
    if not stacks:
        return "process tree killed"
    return (
        f"process tree killed; the Python stacks of {len(stacks)} of its processes at the "
        f"timeout are in {stacks[0].parent.name}/"
    )
