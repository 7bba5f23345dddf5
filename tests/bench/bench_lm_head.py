"""lm_head: wall time of all default variants with warm environments, the harness's
overhead against running the same launcher command by hand (and its own seconds: a run's
wall time less its launch's, free of the launch's spread), and the floor under it: the
imports `reprobox run` needs before it can read a repro.toml (pydantic, packaging and the
spec's models), which no run can skip.

    .venv/bin/nox -s bench -- lm_head [--times 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from common import HARNESS, ROOT, emit, repeat, summarize, timed

# What `reprobox run` imports before it launches (cli.main loads only the run command's
# module), and the part of it that reads and checks a repro.toml.
RUN_IMPORTS = "from reprobox.cli import main; main._parser(['run', 'x'])"
SPEC_IMPORTS = "import reprobox.core.spec"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=3)
    times = parser.parse_args().times
    results = Path(tempfile.mkdtemp(prefix="bench-lm_head-"))
    env = {"REPROBOX_RESULTS": str(results)}
    # Both sides run with their bytecode written, as an installed reprobox (pip compiles it)
    # and the harness's ranks do: with PYTHONDONTWRITEBYTECODE set, an editable checkout
    # would compile every module it changed on each start, and that is not the harness's cost.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    timed([*HARNESS, "run", "lm_head"], env=env)  # warm: environment, bytecode, page cache

    default_variants = repeat([*HARNESS, "run", "lm_head"], times, env=env)

    # The same launch by hand: the command the harness recorded, with the environment it set.
    single = [*HARNESS, "run", "lm_head", "--variant", "broken"]
    timed(single, env=env)
    record = json.loads(next(results.glob("lm_head/*broken/*/record.json")).read_text())
    by_hand_env = {
        "REPRO_RESULT": str(results / "by-hand.json"),
        "PYTHONPATH": str(ROOT / "fixes"),
        "OMP_NUM_THREADS": "1",
    }
    # Alternate the two, so drift in the machine's load hits both alike.
    pairs = [
        (timed(single, env=env), timed(record["command"], env=by_hand_env, cwd=results))
        for _ in range(times)
    ]
    harness = summarize([h for h, _ in pairs])
    # The harness's own seconds, without the launch's spread: a run's wall time less the
    # launch's own (its record's wall_s, from before the launcher starts to after it ended).
    own = summarize([own_seconds(single, env, results) for _ in range(max(times, 9))])
    by_hand = summarize([b for _, b in pairs])
    overhead = harness["median_s"] / by_hand["median_s"] - 1
    # The floor: a bare interpreter against one that imports what `reprobox run` imports
    # before it launches, alternated too (several times each: they take a fraction of a second).
    floors = [
        (timed([sys.executable, "-c", "pass"]), timed([sys.executable, "-c", RUN_IMPORTS]),
         timed([sys.executable, "-c", SPEC_IMPORTS]))
        for _ in range(max(times, 15))
    ]  # fmt: skip
    bare, run_path, spec_only = (summarize([f[i] for f in floors]) for i in range(3))

    def over_by_hand(imports: dict) -> str:
        return f"{(imports['median_s'] - bare['median_s']) / by_hand['median_s']:+.1%}"

    emit({
        "all_default_variants_warm": default_variants,
        "one_variant_via_harness": harness,
        "one_variant_launcher_by_hand": by_hand,
        "harness_overhead": f"{overhead:+.1%}",
        "harness_own_s": own,
        "own_over_by_hand": f"{own['median_s'] / by_hand['median_s']:+.1%}",
        "python_start": bare,
        "run_command_imports": run_path,
        "spec_imports": spec_only,
        "floor_over_by_hand": over_by_hand(spec_only),
        "run_imports_over_by_hand": over_by_hand(run_path),
    })  # fmt: skip


def own_seconds(cmd: list[str], env: dict[str, str], results: Path) -> float:
    """One run's wall seconds less its launch's, as its newest record has them."""
    wall = timed(cmd, env=env)
    newest = max(results.glob("lm_head/*/*/record.json"), key=lambda p: p.stat().st_mtime)
    return wall - json.loads(newest.read_text())["wall_s"]


if __name__ == "__main__":
    main()
