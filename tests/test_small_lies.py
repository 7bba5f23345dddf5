"""Small lies of issue 20, each through the real CLI: a bad `exclude_newer` is bad input
(exit 2; `verdict` 255), not an environment failure that `verdict` would call a skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core.errors import ExitCode
from reprobox.core.instants import exclude_newer_problem


@pytest.mark.parametrize(
    "good", ["2026-11-30", "2026-11-30T00:00:00Z", "2026-11-30T12:30:00+01:00"]
)
def test_exclude_newer_takes_a_date_or_a_timestamp_with_its_offset(good: str) -> None:
    assert exclude_newer_problem(good) is None


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("yesterday", "is not a date (2026-11-30) or an RFC 3339 timestamp"),
        ("1 week", "is not a date"),
        ("2026-13-01", "is not a date"),
        ("2026-11-30 00:00:00Z", "is not a date"),
        ("2026-11-30T00:00:00", "names no UTC offset"),
    ],
)
def test_exclude_newer_refuses_what_would_not_pin_a_resolve(bad: str, why: str) -> None:
    assert why in (exclude_newer_problem(bad) or "")


def _exclude_newer(root: Path, value: str) -> None:
    toml = root / "repros" / "toy" / "repro.toml"
    text = toml.read_text().replace(
        'python = "3.11"\n', f'python = "3.11"\nexclude_newer = "{value}"\n'
    )
    toml.write_text(text)


def test_a_bad_exclude_newer_is_bad_input_before_any_resolve(toy_root: Path) -> None:
    _exclude_newer(toy_root, "yesterday")
    run = reprobox("run", "toy", "--variant", "clean")
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == ExitCode.BAD_INPUT, run.stderr
    assert last.startswith("reprobox: error: ") and "env.exclude_newer" in last, last
    assert "'yesterday' is not a date (2026-11-30) or an RFC 3339 timestamp" in last
    verdict = reprobox("verdict", "toy", "--variant", "clean")
    assert verdict.returncode == 255, verdict.stderr  # not 125: git would skip every commit
    assert not (toy_root / "results").exists()  # refused before anything ran
