"""Shared fixtures: the real checkout, a scratch checkout holding the toy repro, and a way
to run the `reprobox` command as a user would (a subprocess, exit code and all).

`make test` runs the suite on several pytest-xdist workers with `--dist loadgroup`; the
collection hook below keeps together what must not be split or run twice at once (see
`xdist_group_of`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cpu_report import pytest_addoption as pytest_addoption  # --cpu-report FILE
from cpu_report import pytest_runtest_protocol as pytest_runtest_protocol
from gitrepo_fixture import FlagRepo, make_repo
from shared_runs import SharedRun, default_run, shared_dir

from fakes import write_repro as write_repro  # its old home: older imports keep working

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


TIERS = ("slow", "e2e")  # scheduled first, in this order: the longest tests start earliest
# Groups that mostly wait (a Slurm job's time limit, a node's heartbeat, a rendezvous timeout)
# rather than compute: they start first, each on its own worker, while the other workers run
# the longest computing tests beside them (`make test` has a worker for each of them).
WAITING = ("tests/test_slurm.py", "tests/test_multinode.py")
# The costliest tests (`pytest --cpu-report`, four clean-clone runs: 296-351, 125-177, 112-135
# and 73-86 CPU-s): first in their tier, so that none is left alone at the end.
LONGEST = (
    "tests/test_comment_paste_e2e.py::test_the_pasted_comment_gives_the_harness_verdicts[kl]",
    "tests/test_kl.py::test_signed_kl_is_recorded_with_a_conclusion_from_its_own_numbers",
    "tests/test_kl.py::test_release_bisect_names_trl_0_7_2",
    "tests/test_kl.py::test_newer_generations",
)


def xdist_group_of(item: pytest.Item) -> str | None:
    """The worker group an item must share, or None to let any worker take it.

    Container tests share one group: they build and remove images and containers that one
    engine holds for the whole machine. A module whose module- or session-scoped fixture (a
    Slurm cluster, a built git history, a host venv) must be built once, never twice at the
    same time, declares its own group (`pytest.mark.xdist_group("tests/test_NAME.py")` in its
    `pytestmark`; `tests/test_suite_groups.py` checks that each such module does)."""
    if item.get_closest_marker("container") is not None:
        return "container"
    mark = item.get_closest_marker("xdist_group")
    return None if mark is None else str(mark.args[0] if mark.args else mark.kwargs["name"])


def schedule_rank(item: pytest.Item, group: str | None) -> tuple[int, int, int]:
    """Where an item goes in the run's order: the waiting groups, then the slow tier (the
    longest first), the end-to-end tier and the rest. xdist hands out a group where its first
    item stands (with
    `--no-loadscope-reorder`, which the nox session passes; xdist's own order puts the largest
    groups first, so both waiting groups would start on the only two workers)."""
    marked = [i for i, name in enumerate(TIERS) if item.get_closest_marker(name)]
    longest = LONGEST.index(item.nodeid) if item.nodeid in LONGEST else len(LONGEST)
    return (0 if group in WAITING else 1, marked[0] if marked else len(TIERS), longest)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which writes the groups into the ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist: put the container tests in one group, and start the waiting groups, then
    the slow and end-to-end tests first so that no long test is left to run alone at the end.
    A plain run keeps file order. The items xdist schedules are its workers' collections; a
    worker's own option says dist "no" (xdist resets it there), so its `loadgroup` option is
    what tells a worker of a grouped run. xdist's hook then ends each grouped id in `@GROUP`,
    which its scheduler groups by. That hook works up to pytest 8.4; on pytest 9's structured
    ids it writes nothing (pytest-xdist#1386, open), which is why pytest is pinned to 8.4."""
    grouped_worker = getattr(config.option, "loadgroup", False)
    if getattr(config.option, "dist", "no") == "no" and not grouped_worker:
        return
    ranks = {}
    for item in items:
        if item.get_closest_marker("container") is not None:
            item.add_marker(pytest.mark.xdist_group("container"))
        ranks[item.nodeid] = schedule_rank(item, xdist_group_of(item))
    items.sort(key=lambda item: ranks[item.nodeid])


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def default_runs(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> Callable[[str], SharedRun]:
    """`default_runs(NAME)`: the repro's real default run (`reprobox run NAME`), made once
    per session for every worker that asks (tests/shared_runs.py)."""
    where = shared_dir(tmp_path_factory.getbasetemp(), worker_id)
    return lambda name: default_run(name, where)


@pytest.fixture
def scratch_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty checkout (repros/, fixes/) that the harness treats as the repo root."""
    root = tmp_path / "checkout"
    (root / "repros").mkdir(parents=True)
    (root / "fixes").mkdir()
    (root / "noxfile.py").write_text("")
    monkeypatch.setenv("REPROBOX_ROOT", str(root))
    monkeypatch.setenv("REPROBOX_RESULTS", str(root / "results"))
    return root


@pytest.fixture
def toy_root(scratch_root: Path) -> Path:
    """A checkout holding the toy repro of tests/fixtures."""
    shutil.copytree(FIXTURES / "repros" / "toy", scratch_root / "repros" / "toy")
    shutil.copy(FIXTURES / "fixes" / "toy_fix.py", scratch_root / "fixes")
    return scratch_root


@pytest.fixture(scope="module")
def flagrepo(tmp_path_factory: pytest.TempPathFactory) -> FlagRepo:
    """A real git repository of the flag package (tests/gitrepo_fixture.py), one a module."""
    return make_repo(tmp_path_factory.mktemp("git") / "flagpkg")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module: wheels and environments are built once per sha."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def flag_root(scratch_root: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout holding the flagpkg repro, on the module's shared cache."""
    shutil.copytree(FIXTURES / "repros" / "flagpkg", scratch_root / "repros" / "flagpkg")
    monkeypatch.setenv("REPROBOX_CACHE", str(shared_cache))
    return scratch_root


# pip's configuration for the venvs a test has pip make (a pasted block, a bundle without uv):
# install without compiling bytecode, as uv does. pip compiles every module it installs, 9,000
# files for torch & co., 20 of a 34 s install of kl's pins here; Python compiles what a launch
# imports when it imports it. "0", not "1": for a flag stored as False (`--no-compile`), pip
# reads the variable as the option's value (`compile`), so PIP_NO_COMPILE=1 compiles.
PIP_WITHOUT_BYTECODE = {"PIP_NO_COMPILE": "0"}


def reprobox(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess, in the (possibly monkeypatched) environment."""
    return subprocess.run(
        [sys.executable, "-m", "reprobox", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def newest_records(results: Path, repro: str) -> dict[str, dict]:
    """The newest record of every cell of `repro` under `results`, by cell label."""
    found = {}
    for path in sorted((results / repro).glob("*/*/record.json")):
        record = json.loads(path.read_text())
        found[record["label"]] = record
    return found
