"""The statistical verdict through the real CLI: the coin repro (tests/fixtures/repros/coin)
reproduces with a stated probability per launch, drawn from the REPRO_SEED the harness gives
each repeated launch. Its one package, reprobox-coin, is a wheel made here and served from a
real PEP 503 index over HTTP on 127.0.0.1 (tests/wheel_index.py); no torch, one plain process
a launch.

- rate 0.7 -> reproduced (SPRT, clean <= 10% vs reproduced >= 60% at 1% each way);
- rate 0 -> clean;
- rate 0.5 with a budget of 2 -> undecided, exit 8, and `verdict` answers 125 (skip);
- no repeats declared -> exactly one launch, as before.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from wheel_index import WheelIndex, write_wheel

from conftest import FIXTURES, reprobox
from reprobox.core.errors import ExitCode

# its module-scoped fixture is built once: all of it on one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tests/test_repeats_e2e.py")]

COIN = '''"""A coin for the statistical-verdict fixture."""
import random

__version__ = "0.1.0"


def flip(rate, seed):
    return random.Random(seed).random() < rate
'''


def _wheel(folder: Path) -> Path:
    """reprobox_coin-0.1.0-py3-none-any.whl, byte-identical every time."""
    return write_wheel(folder, "reprobox-coin", "0.1.0", {"coin/__init__.py": COIN})


@pytest.fixture(scope="module")
def coin_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("coin-wheels")
    _wheel(folder)
    with WheelIndex([folder]) as index:
        yield index.url


@pytest.fixture
def coin_root(scratch_root: Path, coin_index: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(FIXTURES / "repros" / "coin", scratch_root / "repros" / "coin")
    monkeypatch.setenv("UV_INDEX_URL", coin_index)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    return scratch_root


def _record(root: Path, variant: str) -> dict:
    [path] = sorted((root / "results" / "coin" / f"cpu-{variant}").glob("*/record.json"))
    return json.loads(path.read_text())


def test_a_coin_at_0_7_reproduces_and_one_at_0_is_clean(coin_root: Path) -> None:
    done = reprobox("run", "coin")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    often = _record(coin_root, "often")
    assert often["verdict"] == "reproduced" and often["status"] == "match"
    stat = often["stat"]
    assert stat["test"].startswith("SPRT") and stat["alpha"] == 0.01 and stat["floor"] == 0.1
    assert stat["n"] == len(often["samples"]) >= 3 and stat["reproduced"] < stat["n"] + 1
    assert stat["p"] < 0.01 and stat["ci"][0] > 0.1
    seeds = [s["seed"] for s in often["samples"]]
    assert seeds == list(range(1, 1 + len(seeds)))  # [verdict] seed, then one more each
    for sample in often["samples"]:
        result = json.loads((Path(sample["dir"]) / "result.json").read_text())
        assert result["seed"] == sample["seed"]  # the script saw its own REPRO_SEED
        assert result["reason"].endswith(f"repeat {sample['repeat']}")
        assert sample["verdict"] == ("reproduced" if sample["metrics"]["hit"] else "clean")
    never = _record(coin_root, "never")
    assert never["verdict"] == "clean" and never["stat"]["reproduced"] == 0
    assert never["stat"]["n"] >= 2 and never["stat"]["ci"][1] < 0.6
    table = reprobox("table", "coin")
    assert table.returncode == ExitCode.OK, table.stderr
    row = next(line for line in table.stdout.splitlines() if " often " in line)
    assert f"n={stat['n']}" in row and "CI" in row and "reproduced" in row
    report = reprobox("report", "coin", "--no-env")
    assert report.returncode == ExitCode.OK, report.stdout + report.stderr
    comment = (coin_root / "results" / "coin" / "_report" / "comment.md").read_text()
    line = next(line for line in comment.splitlines() if "`often`" in line and "|" in line)
    assert f"reproduced ({stat['reproduced']}/{stat['n']} reproduced" in line, line
    assert f"n={stat['n']}" in line and "CI" in line


def test_a_coin_at_0_5_with_a_tiny_budget_is_undecided_never_a_verdict(coin_root: Path) -> None:
    done = reprobox("run", "coin", "--variant", "half")
    assert done.returncode == ExitCode.UNDECIDED == 8, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "undecided after 2 launches" in done.stderr
    record = _record(coin_root, "half")
    assert record["verdict"] is None and record["status"] == "undecided"
    assert record["exit_code"] == 8 and len(record["samples"]) == 2
    assert record["stat"]["decision"] == "undecided"
    table = reprobox("table", "coin")
    assert table.returncode == ExitCode.UNDECIDED
    assert any(" half " in line and "undecided" in line for line in table.stdout.splitlines())
    answer = reprobox("verdict", "coin", "--variant", "half")
    assert answer.returncode == 125, answer.stdout + answer.stderr  # git bisect run: skip


def test_without_repeats_one_launch_runs_as_before(coin_root: Path) -> None:
    done = reprobox("run", "coin", "--variant", "once")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    record = _record(coin_root, "once")
    assert record["samples"] == [] and record["stat"] is None
    assert (Path(record["dir"]) / "result.json").is_file()
    assert not list(Path(record["dir"]).glob("repeat-*"))


def test_launches_run_k_at_a_time_where_the_back_end_allows(coin_root: Path) -> None:
    """--workers 4 (the detached back end, which runs launches apart): rounds of 4 launches,
    the SPRT read after each round (its boundaries hold wherever it is read)."""
    done = reprobox("run", "coin", "--variant", "often", "--workers", "4")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    record = _record(coin_root, "often")
    assert record["verdict"] == "reproduced"
    assert record["stat"]["n"] == len(record["samples"]) == 8  # 4 leave it open (3 of 4)
    assert sorted(s["repeat"] for s in record["samples"]) == list(range(8))


def test_ctrl_c_in_the_repeats_keeps_the_launches_judged_and_leaves_nothing(
    coin_root: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "coin", "--variant", "slow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    folder = coin_root / "results" / "coin" / "cpu-slow"
    deadline = time.monotonic() + 300
    while not list(folder.glob("*/repeat-001")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the second launch is running
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert "Traceback" not in stderr
    record = _record(coin_root, "slow")
    assert record["reason"] == "interrupted" and record["verdict"] is None
    assert [s["repeat"] for s in record["samples"]] == [0]  # the launch judged before it
    left = []
    for found in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(found.info["cmdline"] or [])
        if str(coin_root) in cmdline and found.pid != os.getpid():
            left.append(cmdline)
    assert left == []
