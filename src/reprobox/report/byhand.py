"""A launch as a person types it, for a bundle's README and run.sh and a report's commands:
the harness's start-up-only torchrun options left out, several processes spelled torchrun."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reprobox.core import spec
from reprobox.core.cells import make_cell, script_args
from reprobox.envs.torch_source import PYTORCH_CPU_INDEX

TORCH_LINKS = f"{PYTORCH_CPU_INDEX}/torch/"  # a flat page of the CPU wheels: a find-links
# torchrun options that only change how ranks start (the harness's speed-ups), not what
# they compute: a person's line leaves them out.
_STARTUP_ONLY = {"--start_method": 1, "--start-method": 1, "--run_path": 0, "--run-path": 0}


@dataclass(frozen=True)
class ByHand:
    """A launch as a person types it: variables to set, then the command."""

    env: dict[str, str]
    argv: list[str]

    def line(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{prefix} {shlex.join(self.argv)}".strip()


def by_hand(
    repro: spec.Repro,
    variant: str,
    params: Mapping[str, str] | None = None,
    fixes: str = "fixes",
    person: bool = False,
) -> ByHand:
    """The plain launcher line of a variant, run from a folder holding the script (and
    `fixes/`): `torchrun --nproc_per_node 4 average.py --variant broken --averaging sum_div`.
    With `person`, a script the harness only wraps (`[repro] by_hand`) is run itself, with
    the arguments the wrapper passes it (all but `--variant NAME`): `python bug.py --fix`.

    A `python` launch of several processes is spelled with torchrun, which gives each rank
    the same environment the harness does (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    launch = repro.launch(variant)
    args = script_args(repro, make_cell(repro, variant, params=params))
    script = repro.spec.repro.script
    if person and repro.spec.repro.by_hand:
        script = repro.spec.repro.by_hand
        args = args[2:] if args[:1] == ["--variant"] else args
    env = dict(launch.env)
    if repro.variant(variant).fix:
        env["PYTHONPATH"] = fixes
    extra = _person_args(list(launch.args)) if launch.launcher == "torchrun" else list(launch.args)
    if launch.launcher == "accelerate":
        config = ["--config_file", launch.config] if launch.config else []
        argv = ["accelerate", "launch", *config, "--num_processes", str(launch.processes)]
        return ByHand(env, [*argv, *extra, script, *args])
    if launch.launcher == "torchrun" or launch.processes > 1:
        nproc = ["--nproc_per_node", str(launch.processes)]
        torchrun_extra = extra if launch.launcher == "torchrun" else []
        return ByHand(env, ["torchrun", *nproc, *torchrun_extra, script, *args])
    return ByHand(env, ["python", *extra, script, *args])


def _person_args(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = 0
    for arg in args:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in _STARTUP_ONLY:
            skip = 0 if "=" in arg else _STARTUP_ONLY[name]
            continue
        kept.append(arg)
    return kept


def top_pins(repro: spec.Repro, variant: str, platform: str = "cpu") -> list[str]:
    """The requirements repro.toml names for a variant (what `pip install` gets)."""
    return repro.requirements(variant, platform)


def pip_line(pins: Sequence[str]) -> str:
    return "pip install " + " ".join(shlex.quote(p) for p in pins)
