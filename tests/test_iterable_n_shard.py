"""The iterable_n_shard corpus repro (accelerate#3643): only the AttributeError naming
`n_shard` is its symptom (any other exception stays an error), as units; its default variants
for real on 2 processes in the nightly tier (`make test` checks only the corpus's consistency)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from shared_runs import SharedRun

from conftest import ROOT, newest_records
from reprobox.core.errors import ExitCode

sys.path.insert(0, str(ROOT / "repros" / "iterable_n_shard"))
import iterable_n_shard as script


def _raised(message: str) -> AttributeError:
    try:
        raise AttributeError(message)
    except AttributeError as error:
        return error


def test_only_the_missing_n_shard_is_the_symptom() -> None:
    found = script.symptom(_raised("'IterableDataset' object has no attribute 'n_shard'"))
    assert found is not None and found["type"] == "AttributeError"
    assert found["where"].endswith(
        f"test_iterable_n_shard.py:{_raised.__code__.co_firstlineno + 2}"
    )
    # the fixed spelling, or another attribute: not the bug (the caller re-raises: an error)
    assert script.symptom(_raised("'IterableDataset' object has no attribute 'n_shards'")) is None
    assert script.symptom(_raised("module 'torch' has no attribute 'float8'")) is None


def test_the_verdict_counts_the_ranks_that_raised() -> None:
    error = script.symptom(_raised("'IterableDataset' object has no attribute 'n_shard'"))
    broken = script.summarize(
        [{"rank": r, "raised": True, "exception": error, "seen": []} for r in (0, 1)], 16
    )
    assert broken["verdict"] == "reproduced"
    assert (
        broken["metrics"]["ranks_raising_n_shard"]
        == broken["metrics"]["ranks_raising_n_shard_of"]
        == 2
    )
    assert broken["reason"].startswith(
        "AttributeError: 'IterableDataset' object has no attribute 'n_shard'"
    )
    assert broken["details"]["exceptions"]["1"] == error
    halves = [list(range(0, 16, 2)), list(range(1, 16, 2))]
    clean = script.summarize(
        [{"rank": r, "raised": False, "exception": None, "seen": halves[r]} for r in (0, 1)], 16
    )
    assert clean["verdict"] == "clean" and clean["metrics"]["ranks_raising_n_shard"] == 0
    assert clean["metrics"]["distinct_samples_read"] == clean["metrics"]["samples_read"] == 16


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.nightly
def test_accelerate_1_8_0_raises_on_two_processes_only(
    default_runs: Callable[[str], SharedRun],
) -> None:
    done = default_runs("iterable_n_shard")  # `reprobox run iterable_n_shard`
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    records = newest_records(done.results, "iterable_n_shard")
    assert {label: r["verdict"] for label, r in records.items()} == {
        "broken": "reproduced", "fixed": "clean", "single_process": "clean",
    }  # fmt: skip
    broken = records["broken"]
    assert broken["metrics"]["ranks_raising_n_shard"] == 2
    assert "no attribute 'n_shard'" in broken["reason"]
    assert broken["result"]["versions"]["accelerate"] == "1.8.0"
    fixed = records["fixed"]
    assert fixed["result"]["versions"]["accelerate"] == "1.8.1"
    assert fixed["metrics"]["distinct_samples_read"] == 16  # sharded, every row read once
    assert records["single_process"]["result"]["world_size"] == 1
