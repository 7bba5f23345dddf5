"""Bounded input: an oversize result is a result error naming its size (never a verdict),
an endless log keeps its head and tail, and `table` / `report` never load a huge record
(peak memory measured through the real CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core.errors import LaunchError
from reprobox.core.protocol import MAX_RESULT_BYTES, read_result
from reprobox.core.records import MAX_RECORD_BYTES, Record
from reprobox.run.rank_logs import bound_logs, cap_log


def _oversize_json(path: Path, size: int) -> None:
    """A valid JSON object of `size` bytes: a result a script padded with data."""
    head = '{"schema": 1, "verdict": "reproduced", "metrics": {"level": 1.0}, "pad": "'
    with path.open("w") as out:
        out.write(head)
        chunk = "x" * (1 << 20)
        left = size - len(head) - 2
        while left > 0:
            out.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        out.write('"}')


def test_an_oversize_result_is_an_error_naming_its_size(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    _oversize_json(result, MAX_RESULT_BYTES + 1024)
    with pytest.raises(LaunchError, match=r"is 10\.0 MiB, over the 10\.0 MiB a result may hold"):
        read_result(result)
    _oversize_json(result, 1000)  # the same shape within the limit is read
    assert read_result(result)["verdict"] == "reproduced"


def test_a_huge_log_keeps_its_head_and_tail_and_says_what_was_cut(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    with log.open("w") as out:
        out.write("FIRST LINE\n")
        for i in range(400_000):
            out.write(f"step {i:08d} loss 0.123456\n")
        out.write("LAST LINE: RuntimeError\n")
    size = log.stat().st_size
    assert cap_log(log, head=1 << 20, tail=1 << 20)
    kept = log.read_text()
    assert kept.startswith("FIRST LINE\n") and kept.endswith("LAST LINE: RuntimeError\n")
    assert "of this log cut here" in kept and f"{size / (1 << 20):.1f} MiB" in kept
    assert log.stat().st_size < (2 << 20) + 1024
    assert not cap_log(log, head=1 << 20, tail=1 << 20)  # idempotent
    assert bound_logs(tmp_path) == [log]


def test_a_record_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    _oversize_json(record, MAX_RECORD_BYTES + 1)
    with pytest.raises(ValueError, match="a record may hold"):
        Record.load(record)


@pytest.mark.e2e
def test_table_and_report_stay_small_beside_a_huge_record(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "reproduced")
    assert done.returncode == 0, done.stderr
    good = next((toy_root / "results" / "toy" / "cpu-reproduced").glob("*/record.json"))
    data = json.loads(good.read_text())
    huge_dir = good.parent.parent / "20991231T000000-ffffff"  # newer than the measured one
    huge_dir.mkdir()
    data["dir"] = str(huge_dir)
    data["started_at"] = "2099-12-31T00:00:00Z"
    data["result"] = {"pad": "x" * (200 << 20)}  # a 200 MiB record, as main wrote them
    (huge_dir / "record.json").write_text(json.dumps(data))
    for command in (["table", "toy"], ["report", "toy", "--no-env"]):
        peak = _peak_rss_mib([sys.executable, "-m", "reprobox", *command])
        assert peak < 150, (command, peak)
    table = reprobox("table", "toy")
    assert table.returncode == 0 and "reproduced" in table.stdout  # the measured verdict


def _peak_rss_mib(argv: list[str]) -> float:
    """The peak resident memory of the command, from the kernel (ru_maxrss of the only child
    of a fresh parent: this process's own children include torch runs)."""
    measure = (
        "import resource, subprocess, sys\n"
        "proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "assert 'Traceback' not in proc.stderr, proc.stderr\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1]) / 1024
