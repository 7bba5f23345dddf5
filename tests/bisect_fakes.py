"""Fakes for bisect tests: a release index, a scripted release history and a repro to point
them at. The bisect code under test is the real one; only the runs and the index are fake."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from packaging.version import Version

from fakes import FakeIndex, repro_toml
from reprobox.bisect.prober import Outcome, Probes, Target
from reprobox.core import spec
from reprobox.core.protocol import Verdict
from reprobox.core.settings import Settings
from reprobox.envs.index import Release
from reprobox.run import pipeline

R, C = Verdict.REPRODUCED, Verdict.CLEAN

HIST_TOML = repro_toml(
    title="a fake release history",
    pins=["transformers==4.47.0", "accelerate==0.23.0", "numpy==1.26.0"],
    metric="loss_gap",
)

# transformers, as measured upstream: the loss bug fixed in 4.46.0 (a yanked release),
# regressed in 4.47.0, patched in 4.47.1, back in 4.48.0, fixed for good in 4.48.1.
TRANSFORMERS = [
    ("4.44.2", R), ("4.45.0", R), ("4.45.1", R), ("4.45.2", R),
    ("4.46.0", C), ("4.46.1", C), ("4.46.2", C), ("4.46.3", C),
    ("4.47.0", R), ("4.47.1", C), ("4.48.0", R), ("4.48.1", C),
    ("4.48.2", C), ("4.48.3", C), ("4.49.0", C),
]  # fmt: skip
YANKED = {"4.46.0"}


def transformers_index(extra: list[Release] | None = None) -> FakeIndex:
    base = datetime(2024, 8, 1, tzinfo=UTC)
    releases = [
        Release(Version(v), yanked=v in YANKED, uploaded=base.replace(day=1 + n))
        for n, (v, _) in enumerate(TRANSFORMERS)
    ]
    releases.append(Release(Version("4.47.0rc1"), uploaded=base))  # never a candidate
    return FakeIndex({"transformers": releases + (extra or [])})


@dataclass
class FakeHistory:
    """Scripted verdicts per item; counts every run it is asked for."""

    verdicts: Mapping[str, Verdict | None]
    env: Mapping[str, str] = field(default_factory=dict)  # item -> env key (default: item)
    calls: list[tuple[str, int]] = field(default_factory=list)
    interrupt_after: int | None = None  # raise KeyboardInterrupt on this many-th run + 1
    # item -> the verdicts of its attempts 1, 2, ... (a noisy item; `verdicts` otherwise)
    by_attempt: Mapping[str, Sequence[Verdict | None]] = field(default_factory=dict)

    def run(self, item: str, attempt: int) -> Outcome:
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            raise KeyboardInterrupt  # the bisect is killed mid-way
        self.calls.append((item, attempt))
        verdict = (
            self.by_attempt[item][attempt - 1] if item in self.by_attempt else self.verdicts[item]
        )
        if verdict is None:
            return Outcome("skip", reason="cannot test: no such op here", wall_s=0.5)
        return Outcome("verdict", verdict, wall_s=1.0, record=f"runs/{item}")

    def env_key(self, item: str) -> str:
        return self.env.get(item, f"env-{item}")

    @property
    def probes(self) -> Probes[str]:
        return Probes(run=self.run, env_key=self.env_key)

    def items_run(self) -> list[str]:
        return [item for item, _ in self.calls]


def transformers_history(**changes: Verdict | None) -> FakeHistory:
    verdicts: dict[str, Verdict | None] = dict(TRANSFORMERS)
    verdicts.update({k.replace("_", "."): v for k, v in changes.items()})
    return FakeHistory(verdicts)


def hist_target(root: Path, toml: str = HIST_TOML, name: str = "hist") -> Target:
    directory = root / "repros" / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "script.py").write_text("print('hi')\n")
    (directory / "repro.toml").write_text(toml)
    repro = spec.load(root, name)
    settings = Settings.from_env({"REPROBOX_ROOT": str(root)})
    return Target(repro, "broken", pipeline.RunOptions(platform="cpu"), settings)
