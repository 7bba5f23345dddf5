"""Small lies of issue 20, through the real CLI: a bad `exclude_newer` is bad input (exit 2;
`verdict` 255), not an environment failure that `verdict` would call a skip; `--range A..B`
is `>=A,<=B`, and a range that is neither form says which forms it takes."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import reprobox
from reprobox.core.errors import ExitCode
from reprobox.core.instants import exclude_newer_problem
from reprobox.envs.index import Release, select, version_range


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


# ---- --range A..B --------------------------------------------------------------------------


def test_a_range_of_two_releases_is_both_ends_included() -> None:
    releases = [Release(Version(v)) for v in ("2.15.0", "2.16.0", "2.17.1", "3.0.0", "3.0.1")]
    assert [str(v) for v in select(releases, "2.16.0..3.0.0")] == ["2.16.0", "2.17.1", "3.0.0"]
    assert version_range(" 2.16.0 .. 3.0.0 ") == SpecifierSet(">=2.16.0,<=3.0.0")
    assert version_range(">=2.16.0,<3") == SpecifierSet(">=2.16.0,<3")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("2.16.0..3.0.0x", "'2.16.0..3.0.0x' is not a version range; give a specifier such as "
         "'>=4.44.2,<=4.49.0', or FIRST..LAST ('4.44.2..4.49.0', both ends in)"),
        ("2.16.0-3.0.0", "is not a version range; give a specifier such as"),
        ("3.0.0..2.16.0", "'3.0.0..2.16.0': 3.0.0 comes after 2.16.0; give FIRST..LAST"),
    ],
)  # fmt: skip
def test_a_bad_sweep_range_shows_the_forms_it_takes(toy_root: Path, text: str, said: str) -> None:
    done = reprobox("sweep", "toy", "--package", "numpy", "--range", text)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("reprobox: error: ") and said in last, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_a_sweep_takes_first_dot_dot_last(toy_root: Path) -> None:
    """Parsed and sent to the index: no numpy release lies in 99.0.0..99.1.0."""
    done = reprobox("sweep", "toy", "--package", "numpy", "--range", "99.0.0..99.1.0")
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "reprobox: error: no release of numpy matches '99.0.0..99.1.0'"
    )
