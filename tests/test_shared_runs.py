"""The session's shared default run: asked for at once by two callers (two xdist workers in
a real session), the repro runs once and both read the same run's exit code and records."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from shared_runs import default_run, shared_dir

from conftest import newest_records


def test_the_shared_folder_is_the_workers_common_parent(tmp_path: Path) -> None:
    assert shared_dir(tmp_path / "popen-gw1", "gw1") == tmp_path
    assert shared_dir(tmp_path, "master") == tmp_path


@pytest.mark.e2e
def test_two_callers_at_once_share_one_real_run(toy_root: Path, tmp_path: Path) -> None:
    where = tmp_path / "shared"
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: default_run("toy", where), range(2))
    assert first == second and first.returncode == 0, first.stderr
    records = newest_records(first.results, "toy")
    assert {r["verdict"] for r in records.values()} == {"clean", "reproduced"}
    runs = list((first.results / "toy").glob("*/*/record.json"))
    assert len(runs) == len(records), runs  # each default cell ran once, not twice
