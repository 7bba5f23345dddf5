"""Runs the reported script as a maintainer would (`python SCRIPT ARGS`, from this folder) and
keeps its contract: exit 0 is clean, 1 reproduced, 125 cannot test here (its last output
line says why), and any other exit an error, never a verdict. A failure with a traceback
whose last line does not hold EXPECTED is a crash, not the bug: an error too. The metrics
are what the script reports: its own $REPRO_RESULT when it writes one, else a last stdout
line of JSON (`{"max_diff": 0.5}`), with `expected_failure` (1 reproduced, 0 clean) beside
them. Written by `reprobox new --from`; it never imports reprobox."""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "bug.py"
EXPECTED = "AssertionError"
CODES = {0: "clean", 1: "reproduced", 125: "cannot_test"}

parser = argparse.ArgumentParser()
parser.add_argument("--variant", default="adhoc")
args, rest = parser.parse_known_args()
target = os.environ.get("REPRO_RESULT")
if target and os.path.exists(target):
    os.remove(target)  # what is there after the run is the script's own
done = subprocess.run(
    [sys.executable, str(SCRIPT), *rest], cwd=HERE, capture_output=True, text=True
)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
errors = [line.strip() for line in done.stderr.splitlines() if line.strip()]
said = [line.strip() for line in done.stdout.splitlines() if line.strip()]
last = errors[-1] if errors else (said[-1] if said else "")
verdict = CODES.get(done.returncode)
if verdict == "reproduced" and "Traceback (most recent call last)" in done.stderr:
    verdict = "reproduced" if EXPECTED in last else None  # a crash is not the bug
if verdict is None:
    print(
        f"{SCRIPT.name} failed otherwise (exit {done.returncode}: {last or 'no error line'}); "
        f"not the expected {EXPECTED}",
        file=sys.stderr,
    )
    sys.exit(done.returncode if done.returncode > 1 and done.returncode != 125 else 2)
if target and os.path.exists(target):
    sys.exit(done.returncode)  # the script speaks the protocol itself


def reported(lines):
    """The metrics of the last stdout line that is a JSON object of finite numbers."""
    for line in reversed(lines):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(found, dict)
            and found
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in found.values()
            )
        ):
            return {str(k): float(v) for k, v in found.items()}
    return {}


if target:
    metrics = {}
    if verdict != "cannot_test":
        metrics = {"expected_failure": 1.0 if verdict == "reproduced" else 0.0}
        metrics.update(reported(said))
    why = {"clean": f"{SCRIPT.name} exited 0", "cannot_test": f"{SCRIPT.name} cannot test here"}
    result = {
        "schema": 1,
        "variant": args.variant,
        "verdict": verdict,
        "reason": why["clean"] if verdict == "clean" else (last or why["cannot_test"]),
        "metrics": metrics,
    }
    tmp = target + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, target)
sys.exit(done.returncode)
