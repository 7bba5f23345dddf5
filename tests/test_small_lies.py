"""Small lies of issue 20, through the real CLI: a bad `exclude_newer` is bad input (exit 2;
`verdict` 255), not an environment failure that `verdict` would call a skip; `--range A..B`
is `>=A,<=B`, and a range that is neither form says which forms it takes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from bisect_fakes import hist_target, transformers_history, transformers_index
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import reprobox
from reprobox.bisect.prober import BisectError
from reprobox.bisect.releases import release_bisect
from reprobox.core.errors import ExitCode
from reprobox.core.instants import exclude_newer_problem
from reprobox.envs import torch_source
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


# ---- the host torch probe honours --timeout ------------------------------------------------


def _running(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in words:
            found.append(cmdline.parent.name)
    return found


@pytest.mark.e2e
def test_the_host_probe_waits_no_longer_than_the_timeout(
    toy_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host python that hangs on import (a stale network file system, say): the run ends
    after --timeout, not 300 s, with one line, and what the probe started is gone too."""
    toml = toy_root / "repros" / "toy" / "repro.toml"
    toml.write_text(toml.read_text() + '\n[platforms.cpu]\nhost_torch = ">=2.0"\n')
    marker = "47.25"
    hung = tmp_path / "hung-python"
    hung.write_text(f"#!/bin/sh\nsleep {marker} &\nexec sleep {marker}\n")
    hung.chmod(0o755)
    monkeypatch.setenv("REPROBOX_TORCH_SOURCE", "host")
    monkeypatch.setenv("REPROBOX_HOST_PYTHON", str(hung))
    started = time.monotonic()
    done = reprobox("run", "toy", "--variant", "clean", "--timeout", "2", timeout=40)
    assert time.monotonic() - started < 30, done.stderr
    assert done.returncode == ExitCode.ENV_FAILED, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"reprobox: error: toy clean: REPROBOX_HOST_PYTHON={hung}: importing torch took over 2 s"
    )
    assert _running(marker) == []


@pytest.mark.e2e
def test_the_host_torch_version_is_what_imports_not_its_metadata(tmp_path: Path) -> None:
    """A host whose torch metadata says 2.99.0 (a copied or hand-edited site install) but
    whose torch imports as 2.13.0+cpu: the probe, and so the record and the range check,
    say what imports."""
    from test_host_torch import HOST_TORCH, _host_venv

    python = _host_venv(tmp_path / "host")
    [metadata] = (python.parent.parent / "lib").glob("python3.*/site-packages/torch-*/METADATA")
    text = metadata.read_text().replace(f"Version: {HOST_TORCH}", "Version: 2.99.0")
    metadata.unlink()  # a hard link into uv's cache: a new file, never an edit of the cache's
    metadata.write_text(text)
    said = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert said.stdout.strip() == "2.99.0"
    torch_source.probe_host.cache_clear()
    assert torch_source.probe_host(str(python)).version == HOST_TORCH


# ---- a bisect end that cannot be tested says what to do next ------------------------------


def test_an_end_that_cannot_be_tested_suggests_a_sweep_or_a_nearer_end(tmp_path: Path) -> None:
    history = transformers_history(**{"4_44_2": None})  # the --bad end cannot be tested
    with pytest.raises(BisectError) as refused:
        release_bisect(
            hist_target(tmp_path), "transformers", "4.46.1", "4.44.2", transformers_index(),
            probes=history.probes,
        )  # fmt: skip
    said = str(refused.value)
    assert said.startswith("--bad 4.44.2 cannot be tested here: cannot test: ")
    assert said.endswith(
        "; `reprobox sweep hist --package transformers --range '>=4.44.2,<=4.46.1' "
        "--variant broken` probes every release and marks those it cannot test, or move "
        "--bad to the nearest release that can be tested here"
    ), said
