"""The contract between the harness and a repro script (see repros/README.md).

A script exits 0 (clean), 1 (reproduced) or 125 (cannot test) and writes one result JSON.
This module reads that JSON back strictly: a half-written or foreign file is an error,
never a verdict.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from reprobox.core.errors import LaunchError

RESULT_ENV = "REPRO_RESULT"
CACHE_ENV = "REPRO_CACHE"  # a folder the script may keep built things in (models, ops)
PLAN_ENV = "REPRO_PLAN"  # a batch of variants in one launch (repros/README.md, "Batching")
SCHEMA_VERSION = 1
# The most a result file may hold (repros/README.md): metrics and versions, not data. A bigger
# one is a harness/result error, never read (it would be copied into the record).
MAX_RESULT_BYTES = 10 * 1024 * 1024


class Verdict(StrEnum):
    CLEAN = "clean"
    REPRODUCED = "reproduced"
    CANNOT_TEST = "cannot_test"

    @property
    def exit_code(self) -> int:
        return {"clean": 0, "reproduced": 1, "cannot_test": 125}[self.value]


def launch_exit_code(verdicts: list[Verdict]) -> int:
    """The code every rank of a launch exits with for these results (one, or a batch's):
    1 if any case reproduced, else 125 if any could not test, else 0."""
    if Verdict.REPRODUCED in verdicts:
        return 1
    if Verdict.CANNOT_TEST in verdicts:
        return 125
    return 0


class RankExit(BaseModel):
    """How one process of a launch ended: `rank` None is the launcher itself; a negative
    `code` is the signal that killed it (as subprocess reports it)."""

    model_config = ConfigDict(frozen=True)

    rank: int | None
    code: int


class Expectation(StrEnum):
    """What a variant should give; `unknown` records a measurement without judging it."""

    CLEAN = "clean"
    REPRODUCED = "reproduced"
    CANNOT_TEST = "cannot_test"
    UNKNOWN = "unknown"


def read_result(path: Path) -> dict[str, Any]:
    """Load and validate a script's result JSON; raise LaunchError on anything off (one over
    MAX_RESULT_BYTES too, naming its size, before it is read)."""
    try:
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            raise LaunchError(
                f"result {path} is {size_text(size)}, over the {size_text(MAX_RESULT_BYTES)} "
                "a result may hold (not read)"
            )
        text = path.read_text()
    except FileNotFoundError:
        raise LaunchError(f"no result written at {path}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LaunchError(f"result {path} is not valid JSON (half-written?): {exc.msg}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"result {path} is not a JSON object")
    if data.get("schema") != SCHEMA_VERSION:
        raise LaunchError(f"result {path} has schema {data.get('schema')!r}, want {SCHEMA_VERSION}")
    try:
        Verdict(str(data.get("verdict")))
    except ValueError:
        said = f" ({data['reason']})" if isinstance(data.get("reason"), str) else ""
        raise LaunchError(
            f"result {path} has no valid verdict: {data.get('verdict')!r}{said}"
        ) from None
    metrics = data.get("metrics", {})
    if not isinstance(metrics, dict) or not all(_is_number(v) for v in metrics.values()):
        raise LaunchError(f"result {path}: 'metrics' must map names to numbers")
    return data


def size_text(size: int) -> str:
    """A byte count as people read it: `524.3 MiB`, `812 bytes`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
