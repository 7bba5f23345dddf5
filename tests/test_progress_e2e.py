"""Progress that never goes silent, through the real CLI: a repro whose script sleeps 70 s,
run as CI runs it (CI=true, output to a pipe), says each phase in a line and is never silent
for 30 s (the default heartbeat, REPROBOX_HEARTBEAT_S=25); a run ends with its tally line.

The repro ("nap") needs no torch: its one package, reprobox-coin, is a wheel made here and
served from a real PEP 503 index on 127.0.0.1 (tests/wheel_index.py). `nap_root` is shared
with tests/test_resume_e2e.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_repeats_e2e import _wheel
from wheel_index import WheelIndex

from conftest import reprobox
from reprobox.core.errors import ExitCode

# its module-scoped fixture is built once: all of it on one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tests/test_progress_e2e.py")]

NAP_TOML = """\
[repro]
title = "a repro that sleeps, for progress and resume"
upstream = "https://example.invalid/nap"
script = "nap.py"

[launch]
launcher = "python"
processes = 1
timeout = 300

[env]
python = "3.11"
pins = ["reprobox-coin==0.1.0"]

[verdict]
reproduced_if = [{ metric = "hit", above = 0.5 }]

[variants.quick]
expect = "clean"
args = ["--sleep", "0"]

[variants.slow]
expect = "clean"
args = ["--sleep", "70"]
default = false

[variants.nap]
expect = "clean"
args = ["--sleep", "15"]
default = false

[variants.wrong]
expect = "reproduced"
args = ["--sleep", "0"]
default = false
"""

NAP_SCRIPT = """\
import argparse, json, os, sys, time

import coin

parser = argparse.ArgumentParser()
parser.add_argument("--variant", default="adhoc")
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()
time.sleep(args.sleep)
result = {
    "schema": 1, "variant": args.variant, "verdict": "clean", "reason": "slept",
    "metrics": {"hit": 0.0}, "versions": {"reprobox-coin": coin.__version__},
    "device": "cpu", "world_size": 1, "seed": 0, "python": sys.version.split()[0],
    "wall_time_s": args.sleep,
}
with open(os.environ["REPRO_RESULT"], "w") as handle:
    json.dump(result, handle)
"""


@pytest.fixture(scope="module")
def nap_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("nap-wheels")
    _wheel(folder)
    with WheelIndex([folder]) as index:
        yield index.url


@pytest.fixture
def nap_root(scratch_root: Path, nap_index: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A checkout holding the nap repro, with its own environment cache (a first install)."""
    folder = scratch_root / "repros" / "nap"
    folder.mkdir()
    (folder / "repro.toml").write_text(NAP_TOML)
    (folder / "nap.py").write_text(NAP_SCRIPT)
    monkeypatch.setenv("UV_INDEX_URL", nap_index)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("REPROBOX_CACHE", str(scratch_root.parent / "cache"))
    yield scratch_root
    shutil.rmtree(scratch_root.parent / "cache", ignore_errors=True)


def timed_lines(*args: str, env: dict[str, str]) -> tuple[int, list[tuple[float, str]]]:
    """Run the CLI with stdout and stderr in one pipe; its exit code and every line with the
    time it arrived (seconds since start)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    lines: list[tuple[float, str]] = [(0.0, "(start)")]

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))

    reader = threading.Thread(target=read)
    reader.start()
    code = proc.wait(timeout=600)
    reader.join(timeout=10)
    lines.append((time.monotonic() - started, "(exit)"))
    return code, lines


@pytest.mark.slow
def test_ci_says_each_phase_and_is_never_silent_for_30_s(nap_root: Path) -> None:
    env = {**os.environ, "CI": "true"}
    env.pop("REPROBOX_HEARTBEAT_S", None)  # the default: 25 s
    code, lines = timed_lines("run", "nap", "--variant", "slow", env=env)
    text = "\n".join(line for _, line in lines)
    assert code == ExitCode.OK, text
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(lines)]
    assert max(gaps) < 30, (max(gaps), text)
    said = [line for _, line in lines[1:-1]]
    assert "nap slow: resolving the lock" in said, text
    assert "nap slow: preparing the venv environment" in said, text
    assert "nap slow: installing 1 package" in said, text  # its own cache: a first install
    assert "[1/1] nap slow: launching (1 process)" in said, text
    assert "[1/1] nap slow: running (1 process started)" in said, text
    assert any(line.startswith("[1/1] nap slow: scrubbing 1 log") for line in said), text
    assert "[1/1] nap slow: judging" in said, text
    beats = [line for line in said if line.startswith("nap slow: still running")]
    assert len(beats) >= 2, text  # 70 s asleep: a line at about 25 and 50 s
    assert said[-1] == "1 of 1 verdicts as expected", text


def test_a_heartbeat_interval_is_a_positive_number(nap_root: Path) -> None:
    env = {**os.environ, "REPROBOX_HEARTBEAT_S": "soon"}
    code, lines = timed_lines("run", "nap", env=env)
    errors = [line for _, line in lines if line.startswith("reprobox: error:")]
    assert code == ExitCode.BAD_INPUT and len(errors) == 1, lines
    assert "REPROBOX_HEARTBEAT_S='soon' must be a positive number of seconds" in errors[0]
    assert not any("Traceback" in line for _, line in lines)


def test_a_run_ends_with_a_tally_that_names_what_missed(nap_root: Path) -> None:
    done = reprobox("run", "nap", "--variant", "quick", "--variant", "wrong")
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    assert done.stdout.rstrip().splitlines()[-1] == (
        "1 of 2 verdicts as expected; missed: nap wrong gave clean (expected reproduced)"
    )
    table = reprobox("table", "nap")  # what `make repro` ends with (nox -s verdicts)
    assert table.stdout.rstrip().splitlines()[-1] == (
        "1 of 2 verdicts as expected; missed: nap wrong gave clean (expected reproduced)"
    ), table.stdout
