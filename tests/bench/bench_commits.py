"""Commit-bisect figures on the fixture history (tests/gitrepo_fixture.py): probes against
ceil(log2 N) + 2 for N first-parent commits, with and without descending into the merge; a
probe's wheel build cold (uv build from the commit) and cached (per sha); and the wall time
of a cold and a warm bisect.

    .venv/bin/python tests/bench/bench_commits.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import HARNESS, ROOT, emit

sys.path.insert(0, str(ROOT / "tests"))
from gitrepo_fixture import PACKAGE, make_repo

from reprobox.core.errors import EnvError
from reprobox.core.settings import Settings
from reprobox.envs import git


def bisect(env: dict[str, str], repo: Path, log: Path, *extra: str) -> dict:
    args = ["bisect", "flagpkg", "--commits", "--repo", str(repo), "--log", str(log)]
    started = time.perf_counter()
    proc = subprocess.run([*HARNESS, *args, "--good", "v0.1.0", "--bad", "v0.2.0", *extra],
                          env={**os.environ, **env}, capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bisect failed: {proc.stderr}")
    summary = json.loads(log.with_name("summary.json").read_text())
    keep = ("items", "bound", "distinct_probed", "skips", "runs", "launched", "probe_wall_s")
    figures = {k: summary[k] for k in keep}
    figures["answer"] = summary["commit"]["sha"][:10] + f" (PR #{summary['commit']['pr']})"
    figures["within_bound"] = summary["distinct_probed"] <= summary["bound"]
    figures["wall_s"] = round(wall, 2)
    return figures


def builds(repo_url: str, shas: list[str], cache: Path) -> dict:
    """Each commit's wheel built cold (a fresh cache), then fetched from the cache."""
    settings = Settings.from_env({"REPROBOX_CACHE": str(cache)})
    git.ensure_clone(repo_url, settings)
    cold: list[float] = []
    cached: list[float] = []
    for sha in shas:
        for walls in (cold, cached):
            started = time.perf_counter()
            try:
                git.commit_wheel(repo_url, sha, PACKAGE, settings)
            except EnvError:
                break  # the unbuildable commit: not a build time
            walls.append(time.perf_counter() - started)
    return {
        "cold_median_s": round(statistics.median(cold), 3),
        "cached_median_s": round(statistics.median(cached), 5),
        "built": len(cold),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        repo = make_repo(base / "flagpkg")
        root = base / "checkout"
        (root / "repros").mkdir(parents=True)
        (root / "fixes").mkdir()
        (root / "noxfile.py").write_text("")
        shutil.copytree(ROOT / "tests" / "fixtures" / "repros" / "flagpkg",
                        root / "repros" / "flagpkg")  # fmt: skip
        env = {"REPROBOX_ROOT": str(root), "REPROBOX_RESULTS": str(root / "results"),
               "REPROBOX_CACHE": str(base / "cache")}  # fmt: skip
        shas = [repo.shas[name] for name in repo.first_parent()]
        emit(
            {
                "first_parent_commits": len(shas),
                "build_per_probe": builds(repo.url, shas, base / "build-cache"),
                "bisect_cold": bisect(env, repo.path, base / "a" / "probes.jsonl"),
                "bisect_warm": bisect(env, repo.path, base / "b" / "probes.jsonl"),
                "bisect_descend": descend(env, repo.path, base / "c" / "probes.jsonl"),
            }
        )


def descend(env: dict[str, str], repo: Path, log: Path) -> dict:
    """Into the merge: the first-parent search, then one over the branch (its fork and its
    3 commits), each within its own ceil(log2 N) + 2."""
    figures = bisect(env, repo, log, "--first-parent=false")
    figures["bound"] += math.ceil(math.log2(4)) + 2
    figures["within_bound"] = figures["distinct_probed"] <= figures["bound"]
    return figures


if __name__ == "__main__":
    main()
