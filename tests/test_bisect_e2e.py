"""Bisection through the CLI against the toy repro, whose gate variant "regressed" in
numpy 1.26.0: real environments per release, real ranks, a real probe log."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e


def _summary(output: str) -> dict:
    line = next(x for x in output.splitlines() if "summary: " in x)
    return json.loads(Path(line.split("summary: ")[1].strip()).read_text())


def test_release_bisect_names_the_first_reproducing_release(toy_root: Path) -> None:
    done = reprobox("bisect", "toy")  # defaults from [bisect]: numpy 1.25.0 good, 1.26.4 bad
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("first reproducing release: numpy 1.26.0 (assuming one change between")
    assert "between 1.25.0 and 1.26.4; " in last
    summary = _summary(done.stderr)
    assert summary["status"] == "found" and summary["first"] == "1.26.0"
    # ceil(log2 N) + 2 endpoints, plus the boundary confirmations (--confirm 2)
    assert summary["distinct_probed"] <= math.ceil(math.log2(summary["items"])) + 2
    assert summary["runs"] == summary["distinct_probed"] + 4
    assert summary["verified"] == []  # 8 releases: no verify probes by default
    # 2 ends + ceil(log2(7 gaps)) + 2 x 2 confirm probes, counted down as they run (0: unsaid)
    probes = [line for line in done.stderr.splitlines() if line.startswith("probe ")]
    assert [line.rpartition("; about ")[2] for line in probes] == [
        "8 steps left", "7 steps left", "6 steps left", "5 steps left", "4 steps left",
        "3 steps left", "2 steps left", "1 step left", probes[-1].rpartition("; about ")[2],
    ], probes  # fmt: skip
    assert "steps left" not in probes[-1] and "step left" not in probes[-1]

    # same arguments: everything comes from the log; --json prints the summary as one
    # document, as summary.json holds it, with the exit code it has without --json
    again = reprobox("bisect", "toy", "--json")
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("from the log") == summary["runs"]
    doc = json.loads(again.stdout)
    assert doc["command"] == "bisect" and doc["exit_code"] == 0
    assert (doc["summary"]["first"], doc["summary"]["status"]) == ("1.26.0", "found")
    probed = [(p["key"], p["verdict"], p["record"]) for p in summary["probes"]]
    assert [(p["key"], p["verdict"], p["record"]) for p in doc["summary"]["probes"]] == probed
    assert all(p["resumed"] for p in doc["summary"]["probes"])  # read back, none launched
    assert doc["summary"] == json.loads(Path(doc["summary_path"]).read_text())


def test_a_bisect_killed_with_sigkill_resumes(toy_root: Path) -> None:
    log = toy_root / "probes.jsonl"
    args = [sys.executable, "-m", "reprobox", "bisect", "toy", "--log", str(log)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if log.is_file() and len(log.read_text().splitlines()) >= 4:  # header + 3 probes
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(log.read_text().splitlines()) - 1
    done = reprobox("bisect", "toy", "--log", str(log))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("from the log") >= finished >= 3
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("first reproducing release: numpy 1.26.0 (assuming one change")


@pytest.mark.slow
def test_date_bisect_names_the_day_and_the_culprit(toy_root: Path) -> None:
    done = reprobox("bisect", "toy", "--by-date", "2023-06-01..2024-01-31")
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    # numpy 1.26.0 was uploaded 2023-09-16 19:58 UTC: that UTC day, whatever the host's zone
    assert last.startswith(
        "first reproducing date: 2023-09-16 (UTC; new that day: numpy 1.26.0 at 2023-09-16 "
    )
    assert last.endswith("culprit: numpy 1.25.2 -> 1.26.0")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--package", "accelerate", "--good", "1.0.0", "--bad", "1.1.0"],
         "--package accelerate: not a package that toy pins"),
        (["--good", "1.25.0", "--bad", "1.99.0"], "--bad numpy 1.99.0 does not exist"),
        (["--good", "1.25.0", "--bad", "1.25.0"], "the same release"),
        (["--good", "1.26.4", "--bad", "1.25.0"], "--good 1.26.4 is reproduced, not clean"),
        (["--good", "1.25.0", "--bad", "1.25.2"], "--bad 1.25.2 is clean, not reproduced"),
        (["--good", "one"], "--good: 'one' is not a valid version"),
        (["--by-date", "2024-01-01..2023-01-01"], "START must be before END"),
    ],
)  # fmt: skip
def test_bad_bisect_input(toy_root: Path, args: list[str], message: str) -> None:
    done = reprobox("bisect", "toy", *args)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    errors = [x for x in done.stderr.splitlines() if x.startswith("reprobox: error:")]
    assert len(errors) == 1 and message in errors[0], done.stderr


def test_a_log_from_another_bisect_is_refused(toy_root: Path) -> None:
    log = toy_root / "other.jsonl"
    log.write_text(json.dumps({"bisect": {"kind": "release", "repro": "kl"}}) + "\n")
    done = reprobox("bisect", "toy", "--log", str(log))
    assert done.returncode == ExitCode.BAD_INPUT
    assert "belongs to another bisect" in done.stderr


def test_a_second_identical_bisect_says_who_holds_the_log(toy_root: Path) -> None:
    log = toy_root / "probes.jsonl"
    args = [sys.executable, "-m", "reprobox", "bisect", "toy", "--log", str(log)]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (log.is_file() and log.read_text().endswith("\n")):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        second = reprobox("bisect", "toy", "--log", str(log), timeout=120)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert second.returncode == ExitCode.BAD_INPUT, second.stderr
    errors = [x for x in second.stderr.splitlines() if x.startswith("reprobox: error:")]
    assert len(errors) == 1 and f"in use by another bisect (pid {first.pid}," in errors[0]


def test_sweep_prints_the_affected_releases(toy_root: Path) -> None:
    done = reprobox("sweep", "toy", "--range", ">=1.25.2,<=1.26.1")  # [bisect]: numpy, gate
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == (
        "numpy affected: >=1.26.0,<=1.26.1 (3 of 3 releases tested; still reproduces at "
        "1.26.1, the range's last release)"
    )
    assert "events: introduced 1.26.0, still reproduces at 1.26.1, the range's last" in (
        done.stderr
    )
    summary = _summary(done.stderr)
    swept = summary["details"]  # a sweep's map: its kind's details
    assert summary["kind"] == swept["kind"] == "sweep" and swept["affected"] == ">=1.26.0,<=1.26.1"
    assert swept["events"][-1] == {
        "introduced": None, "fixed": None, "last_affected": "1.26.1", "bound": True, "after": None,
    }  # fmt: skip

    again = reprobox("sweep", "toy", "--range", ">=1.25.2,<=1.26.1", "--json")  # from the log
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("from the log") == 3
    doc = json.loads(again.stdout)
    assert doc["command"] == "sweep" and doc["exit_code"] == 0
    assert doc["summary"]["details"]["affected"] == swept["affected"] == ">=1.26.0,<=1.26.1"
    assert doc["summary"] == json.loads(Path(doc["summary_path"]).read_text())


def test_a_log_outside_results_is_checked_against_the_store(toy_root: Path) -> None:
    """An earlier sweep in the store (it saw numpy 1.25.2 reproduce) contradicts the answer
    of a bisect whose log is outside results/; that bisect's summary and runs are its own."""
    from reprobox.bisect.summary import BisectSummary, ProbeEntry
    from reprobox.core.records import RecordStore

    earlier = RecordStore(toy_root / "results").bisect_dir("toy") / "sweep-earlier"
    earlier.mkdir(parents=True)
    seen = BisectSummary(
        kind="sweep", repro="toy", variant="gate", package="numpy", status="mapped",
        probes=[ProbeEntry(key="1.25.2#1", item="1.25.2", verdict="reproduced")],
    )  # fmt: skip
    (earlier / "summary.json").write_text(seen.model_dump_json())
    log = toy_root.parent / "elsewhere" / "mine.jsonl"
    done = reprobox("bisect", "toy", "--log", str(log))
    # main: exit 0, "first reproducing release: numpy 1.26.0" (it read elsewhere/'s parent)
    assert done.returncode == ExitCode.FAILED, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("non-monotone: numpy 1.25.2 reproduces (bisect sweep-earlier)"), last
    assert (log.parent / "mine.summary.json").is_file()
    assert (log.parent / "mine.runs").is_dir() and not (log.parent / "runs").exists()
    assert _summary(done.stderr)["status"] == "non-monotone"
