"""The environment a run used, as the upstream bug templates ask for it.

transformers' form wants `transformers env`, accelerate's `accelerate env`, trl's `trl env`,
DeepSpeed's `ds_report`; torch's wants `python -m torch.utils.collect_env`. Each runs with
the interpreter of the environment the cell ran in (found beside the launcher its record
names), time-bounded, and is skipped with a word where the package (or its command) is
absent. collect_env is trimmed to what a maintainer reads: no CPU-vulnerability lines, no
lscpu dump, no CUDA lines on a CPU run, and its package list (which asks pip, absent from a
uv venv: "[pip3] Could not collect") replaced by the environment's own distributions, read
with `importlib.metadata`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from reprobox.core.records import Record
from reprobox.core.scrub import looks_secret
from reprobox.report.env_trim import trim_stack_report

# (package, command, words) of the stack's own reports, in the order a comment shows them.
STACK_REPORTS: list[tuple[str, list[list[str]]]] = [
    ("transformers", [["transformers", "env"], ["transformers-cli", "env"]]),
    ("accelerate", [["accelerate", "env"]]),
    ("trl", [["trl", "env"]]),
    ("deepspeed", [["ds_report"]]),
]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Distributions worth listing in collect_env's place (besides the repro's own pins).
_RELEVANT = re.compile(
    r"torch|numpy|triton|nvidia|transformers|accelerate|deepspeed|trl|datasets|tokenizers|"
    r"safetensors|peft|huggingface|bitsandbytes|flash|xformers|apex|onnx|optree",
    re.IGNORECASE,
)
# collect_env lines that say nothing on a CPU run.
_CUDA_LINE = re.compile(
    r"^(CUDA runtime version|CUDA_MODULE_LOADING|GPU models and configuration|Nvidia driver "
    r"version|cuDNN version|HIP runtime version|MIOpen runtime version|Is XPU available|"
    r"CUDA used to build PyTorch|ROCM used to build PyTorch)\b"
)
# Of collect_env's lscpu block, the lines that identify the machine.
_CPU_KEEP = re.compile(r"^(Architecture|CPU\(s\)|Model name|Thread\(s\) per core|NUMA node\(s\)):")
# In sys.path order, the first of a name wins: what an import finds (a host-torch venv also
# sees the host's folder, whose copies of the lock's packages come after the venv's own).
_PACKAGES = (
    "import importlib.metadata as m, json; found = {}\n"
    "for d in m.distributions(): found.setdefault(d.metadata['Name'], d.version)\n"
    "print(json.dumps(found))"
)


@dataclass(frozen=True)
class EnvReport:
    """One report's text (or why there is none)."""

    title: str  # e.g. "transformers env"
    text: str  # the output; empty when skipped
    note: str = ""  # why it was skipped or failed, in a few words


@dataclass(frozen=True)
class Environment:
    """What was gathered in one environment: its distributions and the reports."""

    labels: list[str]  # the cells that ran in it
    packages: dict[str, str]  # distribution name -> version, from importlib.metadata
    reports: list[EnvReport]
    absent: list[str] = field(default_factory=list)  # report commands of absent packages


def interpreter(record: Record) -> Path | None:
    """The repro environment's python: the launcher recorded in `command` lives beside it."""
    if not record.command:
        return None
    python = Path(record.command[0]).parent / "python"
    return python if python.is_absolute() and python.exists() else None


def _env(python: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment without secrets, with the venv first on PATH (`accelerate
    env` runs `which accelerate`)."""
    env = {k: v for k, v in os.environ.items() if not looks_secret(k)}
    env.update(extra)
    venv = python.parent.parent
    env["PATH"] = os.pathsep.join([str(python.parent), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def _run(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int | None, str]:
    """(exit status or None when it could not run or timed out, output)."""
    with tempfile.TemporaryDirectory() as cwd:
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:g} s"
        except OSError as exc:
            return None, f"could not run: {exc.strerror or exc}"
    out = proc.stdout.strip() if proc.returncode == 0 else ""
    out = out or (proc.stdout.strip() + "\n" + proc.stderr.strip()).strip()
    return proc.returncode, _ANSI.sub("", out)


def packages(python: Path, env: Mapping[str, str], timeout: float) -> dict[str, str]:
    """The environment's distributions, from the environment itself (no pip needed)."""
    code, out = _run([str(python), "-c", _PACKAGES], env, timeout)
    if code != 0:
        return {}
    try:
        found = json.loads(out.splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def stack_report(
    python: Path, package: str, commands: list[list[str]], installed: Mapping[str, str],
    env: Mapping[str, str], timeout: float,
) -> EnvReport | None:  # fmt: skip
    """`<package> env` in the environment; None when the package is not installed."""
    version = {canonicalize_name(k): v for k, v in installed.items()}.get(
        canonicalize_name(package)
    )
    if version is None:
        return None
    for command in commands:
        script = python.parent / command[0]
        if script.is_file():
            code, out = _run([str(python), str(script), *command[1:]], env, timeout)
            title = " ".join(command)
            if code == 0:
                return EnvReport(title, trim_stack_report(title, out))
            said = out.splitlines()[-1] if out else ""
            why = f"exited {code}" if code is not None else out
            return EnvReport(title, "", f"{why}: {said}" if said and code is not None else why)
    shown = " ".join(commands[0])
    return EnvReport(shown, "", f"{package} {version} has no such command")


def trim_collect_env(
    text: str, installed: Mapping[str, str], pins: Sequence[str], cpu: bool
) -> str:
    """collect_env as a maintainer reads it (see the module's docstring)."""
    out: list[str] = []
    in_cpu = in_versions = False
    for line in text.splitlines():
        if line.startswith("Collecting environment information"):
            continue
        if line.startswith("CPU:"):
            in_cpu = True
            out.append(line)
            continue
        if line.startswith("Versions of relevant libraries"):
            in_versions = True
            continue
        if in_versions:
            continue  # replaced below
        if in_cpu:
            if not line.strip():
                in_cpu = False
                out.append(line)
            elif _CPU_KEEP.match(line):
                out.append(line)
            continue
        if line.startswith("Vulnerability"):
            continue
        if cpu and _CUDA_LINE.match(line):
            continue
        out.append(line)
    wanted = {canonicalize_name(p) for p in pins}
    listed = sorted(
        (name, version)
        for name, version in installed.items()
        if canonicalize_name(name) in wanted or _RELEVANT.search(name)
    )
    if listed:
        out += ["", "Versions of relevant libraries (importlib.metadata of the environment):"]
        out += [f"[env] {name}=={version}" for name, version in listed]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def host_torch_report(record: Record) -> EnvReport:
    """Where torch came from when it was the host's (REPROBOX_TORCH_SOURCE=host): the
    version, CUDA and folder the record names, and the interpreter."""
    host = record.host_torch
    lines = [
        f"torch {host.get('version', '?')} (CUDA {host.get('cuda', '?')})",
        f"from {host.get('path', '?')}",
        f"python {host.get('python_version', '?')} ({host.get('python', '?')})",
    ]
    if host.get("lock_python"):
        lines.append(f"the lock was made for python {host['lock_python']}")
    lines.append("the lock's other pins: in a venv of their own (without torch and CUDA wheels)")
    return EnvReport("host torch (REPROBOX_TORCH_SOURCE=host)", "\n".join(lines))


def gather(
    record: Record,
    pins: Sequence[str],
    extra_env: Mapping[str, str],
    timeout: float,
    labels: Sequence[str] = (),
) -> Environment | None:
    """The stack's reports and trimmed collect_env in the environment `record` ran in, run
    side by side (each within `timeout`); None when that environment is gone."""
    python = interpreter(record)
    if python is None:
        return None
    env = _env(python, extra_env)
    installed = packages(python, env, timeout)
    cpu = str(record.result.get("device", "cpu")).startswith("cpu") or record.platform == "cpu"
    jobs = [(package, commands) for package, commands in STACK_REPORTS]
    with ThreadPoolExecutor(max_workers=3) as pool:
        pending = pool.submit(_run, [str(python), "-m", "torch.utils.collect_env"], env, timeout)
        stack = list(
            pool.map(
                lambda job: stack_report(python, job[0], job[1], installed, env, timeout), jobs
            )
        )
        collect = pending.result()
    reports = [r for r in stack if r is not None]
    if record.host_torch:
        reports.insert(0, host_torch_report(record))
    absent = [" ".join(cmds[0]) for (_, cmds), r in zip(jobs, stack, strict=True) if r is None]
    code, text = collect
    if code == 0:
        reports.append(
            EnvReport(
                "python -m torch.utils.collect_env", trim_collect_env(text, installed, pins, cpu)
            )
        )
    else:
        why = f"exited {code}" if code is not None else text
        reports.append(EnvReport("python -m torch.utils.collect_env", "", why))
    return Environment(list(labels) or [record.label], installed, reports, absent)
