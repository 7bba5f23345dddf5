"""`run --resume` through the real CLI: a 2-cell run of the nap repro is interrupted (SIGINT
from outside, as Ctrl-C sends it) while its second cell runs; `--resume` then runs only that
cell and shows both in the table; a changed script means nothing is skipped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_progress_e2e import nap_index as nap_index  # the fixtures nap_root needs
from test_progress_e2e import nap_root as nap_root

from conftest import reprobox
from reprobox.core.errors import ExitCode

pytestmark = pytest.mark.e2e


def _records(root: Path, variant: str) -> list[dict]:
    paths = sorted((root / "results" / "nap" / f"cpu-{variant}").glob("*/record.json"))
    return [json.loads(path.read_text()) for path in paths]


def test_resume_after_ctrl_c_runs_only_the_missing_cell(nap_root: Path) -> None:
    cells = ["--variant", "quick", "--variant", "nap"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "nap", *cells],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not _records(nap_root, "nap") and time.monotonic() < deadline:
        time.sleep(0.2)  # the second cell's record is saved as it launches
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert [r["status"] for r in _records(nap_root, "quick")] == ["match"]
    assert [r["reason"] for r in _records(nap_root, "nap")] == ["interrupted"]

    done = reprobox("run", "nap", *cells, "--resume")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    quick = _records(nap_root, "quick")
    assert len(quick) == 1, "the measured cell ran again"
    assert f"resume: skipped nap quick: clean, measured {quick[0]['started_at']}" in done.stderr
    assert "resume: running nap nap: no measured record" in done.stderr
    assert [r["status"] for r in _records(nap_root, "nap")] == ["error", "match"]
    rows = [line.split()[:2] for line in done.stdout.splitlines() if line.startswith("nap ")]
    assert rows == [["nap", "quick"], ["nap", "nap"]], done.stdout  # both, as before
    assert done.stdout.rstrip().splitlines()[-1] == "2 of 2 verdicts as expected"


def test_a_changed_script_or_environment_is_never_skipped(nap_root: Path) -> None:
    assert reprobox("run", "nap").returncode == ExitCode.OK
    again = reprobox("run", "nap", "--resume")
    assert again.returncode == ExitCode.OK and "resume: skipped nap quick" in again.stderr
    script = nap_root / "repros" / "nap" / "nap.py"
    script.write_text(script.read_text() + "# changed\n")
    changed = reprobox("run", "nap", "--resume")
    assert changed.returncode == ExitCode.OK, changed.stdout + changed.stderr
    assert "resume: running nap quick: the code changed since" in changed.stderr
    assert len(_records(nap_root, "quick")) == 2
    [newest] = sorted((nap_root / "results" / "nap" / "cpu-quick").glob("*/record.json"))[-1:]
    record = json.loads(newest.read_text())  # as if measured in another environment
    newest.write_text(json.dumps({**record, "lock_hash": "0" * 16}))
    relocked = reprobox("run", "nap", "--resume")
    assert relocked.returncode == ExitCode.OK, relocked.stdout + relocked.stderr
    assert "resume: running nap quick: the lock changed since" in relocked.stderr
    assert len(_records(nap_root, "quick")) == 3


HELPED_SCRIPT = """\
import argparse, importlib, json, os, sys

parser = argparse.ArgumentParser()
parser.add_argument("--variant", default="adhoc")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--fix", default=None)
args = parser.parse_args()
hit = importlib.import_module(args.fix).hit() if args.fix else 0.0
result = {
    "schema": 1, "variant": args.variant, "verdict": "reproduced" if hit else "clean",
    "reason": "helped", "metrics": {"hit": hit}, "versions": {}, "device": "cpu",
    "world_size": 1, "seed": 0, "python": sys.version.split()[0], "wall_time_s": 0.0,
}
with open(os.environ["REPRO_RESULT"], "w") as handle:
    json.dump(result, handle)
sys.exit(1 if hit else 0)
"""
HELPED_VARIANT = """
[variants.helped]
expect = "clean"
args = ["--sleep", "0"]
fix = "nap_fix"
default = false
"""


def test_a_changed_helper_the_fix_imports_is_never_skipped(nap_root: Path) -> None:
    """The fix module imports a helper from fixes/; after the helper changes, `--resume`
    runs the cell again and its new verdict is the one shown (it kept "clean", exit 0, while
    a fresh run gave another answer: issue 35)."""
    folder = nap_root / "repros" / "nap"
    (folder / "nap.py").write_text(HELPED_SCRIPT)
    (folder / "repro.toml").write_text((folder / "repro.toml").read_text() + HELPED_VARIANT)
    fixes = nap_root / "fixes"
    (fixes / "nap_fix.py").write_text(
        "from nap_helper import HIT\n\n\ndef hit():\n    return HIT\n"
    )
    (fixes / "nap_helper.py").write_text("HIT = 0.0\n")
    cell = ["run", "nap", "--variant", "helped"]
    assert reprobox(*cell).returncode == ExitCode.OK
    again = reprobox(*cell, "--resume")
    assert again.returncode == ExitCode.OK and "resume: skipped nap helped" in again.stderr
    (fixes / "nap_helper.py").write_text("HIT = 1.0\n")
    changed = reprobox(*cell, "--resume")
    assert "resume: running nap helped: the code changed since" in changed.stderr, changed.stderr
    assert changed.returncode == ExitCode.FAILED, changed.stdout + changed.stderr
    assert [r["verdict"] for r in _records(nap_root, "helped")] == ["clean", "reproduced"]
