"""kill -9 of the harness while a launch holds ranks that ignore SIGTERM and a daemon that
left their group, session and environment (the stubborn fixture repro, `daemon_stubborn`):
how often something is left behind, and how long the watchdog takes to clear the rest.

    .venv/bin/nox -s bench -- kill9 [--runs 12] [--load 4]

`--load K` keeps K busy processes spinning beside it: the escape this measures (the kernel's
SIGHUP to a newly orphaned process group, see run/launcher.py's _child_setup) showed only on
a loaded machine. A process left behind is killed after it is counted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from common import HARNESS, ROOT, emit

WAIT_S = 20.0  # what "left behind" means: still there this long after the kill


def _spin() -> None:
    while True:
        pass


def _ready(root: Path) -> int:
    logs = (root / "results" / "stubborn").glob("*/*/rank*.log")
    return sum(log.read_text(errors="replace").count("stubborn: ready") for log in logs)


def _left(root: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and str(root) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def one_run() -> tuple[bool, float]:
    """(something was left WAIT_S after the kill, seconds until nothing was)."""
    root = Path(tempfile.mkdtemp(prefix="bench-kill9-")) / "checkout"
    (root / "fixes").mkdir(parents=True)
    (root / "noxfile.py").write_text("")
    shutil.copytree(ROOT / "tests/fixtures/repros/stubborn", root / "repros/stubborn")
    env = {**os.environ, "REPROBOX_ROOT": str(root), "REPROBOX_RESULTS": str(root / "results")}
    harness = subprocess.Popen(
        [*HARNESS, "run", "stubborn", "--variant", "daemon_stubborn"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while _ready(root) < 2 and time.monotonic() < deadline and harness.poll() is None:
        time.sleep(0.1)
    if _ready(root) < 2:
        harness.kill()
        raise SystemExit("the stubborn ranks never said they were ready")
    harness.kill()
    harness.wait()
    killed = time.monotonic()
    while _left(root) and time.monotonic() - killed < WAIT_S:
        time.sleep(0.05)
    cleared = time.monotonic() - killed
    left = _left(root)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    shutil.rmtree(root.parent, ignore_errors=True)
    return bool(left), cleared


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--load", type=int, default=4, help="busy processes beside it")
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    try:
        runs = [one_run() for _ in range(args.runs)]
    finally:
        for burner in burners:
            burner.kill()
    cleared = [seconds for left, seconds in runs if not left]
    emit({
        "runs": args.runs,
        "load": args.load,
        "left_something": sum(left for left, _ in runs),
        "cleared_median_s": round(statistics.median(cleared), 2) if cleared else None,
        "cleared_max_s": round(max(cleared), 2) if cleared else None,
    })  # fmt: skip


if __name__ == "__main__":
    main()
