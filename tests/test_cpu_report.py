"""`pytest --cpu-report FILE` (tests/cpu_report.py): a test's line holds the CPU of the
processes it waited for, and the summary sums what the file holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cpu_report import summarize

from conftest import ROOT


def test_a_tests_line_counts_the_children_it_waited_for(tmp_path: Path) -> None:
    """A real pytest run of one test that starts Python children: its line names it, and
    its children's CPU is there (Python's start alone is CPU)."""
    report = tmp_path / "cpu.jsonl"
    test = "tests/test_launch.py::test_the_wait_between_looks_ends_when_a_process_does"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "--cpu-report", str(report), test],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (line,) = [json.loads(x) for x in report.read_text().splitlines()]
    assert line["id"] == test and line["worker"] == "main"
    assert line["children_cpu_s"] > 0 and line["own_cpu_s"] >= 0
    assert line["wall_s"] >= 0.3  # its quick child sleeps 0.3 s


def test_the_summary_sums_a_test_seen_twice() -> None:
    row = {"worker": "gw0", "start": 0.0, "wall_s": 2.0, "own_cpu_s": 1.0, "children_cpu_s": 3.0}
    lines = [
        {"id": "tests/test_a.py::test_x", **row},
        {"id": "tests/test_a.py::test_x", **row},  # a second run appended to the same file
        {"id": "tests/test_b.py::test_y", **row, "children_cpu_s": 0.5},
    ]
    text = summarize(lines, top=5)
    assert text.splitlines()[0] == "3 tests, 10 CPU-s"
    assert "   8.0     4.0  tests/test_a.py::test_x" in text
    assert "   8.0  tests/test_a.py" in text and "   1.5  tests/test_b.py" in text
