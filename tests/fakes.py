"""The fakes the unit tier shares: one fake back end, one fake package index, and builders of
repro.toml text and repro folders. The code under test is always the real one; only what it
talks to (ranks, an index) is faked here, so each fake is written once and can be trusted
once. The end-to-end tests use none of these."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from reprobox.core.cells import Cell
from reprobox.core.errors import BadInput, EnvError
from reprobox.core.judge import Launched
from reprobox.core.protocol import RankExit
from reprobox.core.spec import Repro
from reprobox.envs.index import PackageIndex, Release
from reprobox.run.backend import Backend, LaunchRequest, NoHandle, Prepared


def _result(case_args: list[str], verdict: str, level: float) -> dict[str, object]:
    variant = case_args[case_args.index("--variant") + 1]
    return {"schema": 1, "variant": variant, "verdict": verdict, "reason": "fake",
            "metrics": {"level": level}}  # fmt: skip


@dataclass
class FakeBackend:
    """Writes the results a script would; `script` maps a variant to (verdict, level, code
    of every rank) and `preflight` to the preflight's exit code."""

    script: dict[str, tuple[str, float, list[int]]] = field(default_factory=dict)
    preflight: dict[str, int] = field(default_factory=dict)
    broken_env: set[str] = field(default_factory=set)
    interrupt_on: str | None = None
    name: str = "fake"
    launches: list[LaunchRequest] = field(default_factory=list)

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        if cell.variant in self.broken_env:
            raise EnvError("cannot install: fake")
        return Prepared(key="env-1", lock=lock, lock_hash="abc", runner="fake", env_s=0.0,
                        handle=NoHandle())  # fmt: skip

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return ["fake", *request.lead.args]

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return ["FAKE_ONLY"]

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        self.launches.append(request)
        variant = request.lead.cell.variant
        if self.interrupt_on == variant and request.preflight is None:
            raise KeyboardInterrupt
        if request.preflight is not None:
            code = self.preflight.get(variant, 0)
            if code == 125:
                out = {**_result(list(request.lead.args), "cannot_test", 0.0), "reason": "no"}
                request.lead.result.write_text(json.dumps(out))
            return Launched(exits=(RankExit(rank=None, code=code),), logs=request.log_dir)
        codes: list[int] = []
        for case in request.cases:
            verdict, level, codes = self.script[case.cell.variant]
            case.result.write_text(json.dumps(_result(list(case.args), verdict, level)))
        exits = tuple(RankExit(rank=i, code=c) for i, c in enumerate(codes))
        return Launched(exits=exits, wall_s=1.0, logs=request.lead.run_dir)


class FakeIndex:
    """A PackageIndex holding given releases. `from_settings` returns itself, so the index
    can stand in for the SimpleIndex class a command builds from its settings."""

    def __init__(self, releases: Mapping[str, list[Release]]) -> None:
        self._releases = {canonicalize_name(k): v for k, v in releases.items()}

    def from_settings(self, settings: object) -> FakeIndex:
        return self

    def releases(self, package: str) -> list[Release]:
        try:
            return list(self._releases[canonicalize_name(package)])
        except KeyError:
            raise BadInput(f"no package {package!r} on the index") from None


# Each fake stands for a protocol: mypy (`nox -s lint` checks this file) fails the day one
# drifts from what it stands for, rather than a test passing against a fake the code no
# longer matches.
_BACKEND: Backend = FakeBackend()
_INDEX: PackageIndex = FakeIndex({})


def _toml_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def repro_toml(
    *,
    title: str,
    script: str = "script.py",
    upstream: str = "https://example.invalid/issues/1",
    launcher: str = "python",
    processes: int = 1,
    timeout: int = 60,
    launch_extra: str = "",
    python: str | None = "3.11",
    pins: Iterable[str] = ("torch==2.13.0",),
    metric: str = "level",
    above: float = 0.0,
    variants: Mapping[str, str] | None = None,
    variant_extra: Mapping[str, str] | None = None,
    extra: str = "",
) -> str:
    """The text of a repro.toml with the usual sections; `variants` maps a variant to its
    expectation, `variant_extra` a variant to more lines of its table, `extra` is appended."""
    launch = f'launcher = "{launcher}"\nprocesses = {processes}\ntimeout = {timeout}\n'
    env = (f'python = "{python}"\n' if python else "") + f"pins = {_toml_list(pins)}\n"
    text = (
        f'[repro]\ntitle = "{title}"\nupstream = "{upstream}"\nscript = "{script}"\n\n'
        f"[launch]\n{launch}{launch_extra}\n[env]\n{env}\n"
        f'[verdict]\nreproduced_if = [{{ metric = "{metric}", above = {above} }}]\n'
    )
    more = variant_extra or {}
    for name, expect in (variants or {"broken": "unknown"}).items():
        text += f'\n[variants.{name}]\nexpect = "{expect}"\n{more.get(name, "")}'
    return text + extra


def write_repro(root: Path, name: str, toml: str, script: str = "script.py") -> Path:
    """A repro folder under root/repros holding `toml` and a script that only prints."""
    directory = root / "repros" / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / script).write_text("print('hi')\n")
    (directory / "repro.toml").write_text(toml)
    return directory
