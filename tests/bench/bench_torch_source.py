"""torch from an HTTP simple index (what a CI job gets from the PyTorch CPU index) against
pip's local find-links folder: environment creation time of the same CPU cell (toy, variant
clean, from its lock), each run cold (a fresh uv cache and harness cache, as on a new runner),
and the verdicts, which must be equal.

    .venv/bin/nox -s bench -- torch_source [--times 2]

The index is this machine's wheel folder served on 127.0.0.1 (tests/wheel_index.py), so the
difference measured is the harness's and uv's, not the network's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import HARNESS, ROOT, emit, summarize

sys.path.insert(0, str(ROOT / "tests"))
from wheel_index import WheelIndex

from reprobox.core.settings import Settings
from reprobox.envs import torch_source

SOURCE_SETTINGS = ("PIP_FIND_LINKS", "REPROBOX_FIND_LINKS", "REPROBOX_TORCH_INDEX",
                   "REPROBOX_TORCH_SOURCE", *torch_source.UV_SETTINGS)  # fmt: skip


def _checkout(base: Path) -> Path:
    """A scratch checkout holding the toy repro, locked as a commit would hold it."""
    root = base / "checkout"
    (root / "repros").mkdir(parents=True)
    (root / "fixes").mkdir()
    (root / "noxfile.py").write_text("")
    shutil.copytree(ROOT / "tests/fixtures/repros/toy", root / "repros/toy")
    shutil.copy(ROOT / "tests/fixtures/fixes/toy_fix.py", root / "fixes")
    return root


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in (0, 1):
        sys.exit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return proc


def _cold_run(root: Path, base: Path, source: dict[str, str], tag: str) -> dict[str, object]:
    """One run with empty caches; the record's env_s is the environment's creation time."""
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=base))
    env = {k: v for k, v in os.environ.items() if k not in SOURCE_SETTINGS}
    env |= {"REPROBOX_ROOT": str(root), "REPROBOX_RESULTS": str(work / "results"),
            "REPROBOX_CACHE": str(work / "cache"), "UV_CACHE_DIR": str(work / "uv")}  # fmt: skip
    env |= source
    _run([*HARNESS, "run", "toy", "--variant", "clean"], env)
    record = json.loads(next((work / "results").glob("toy/*/*/record.json")).read_text())
    shutil.rmtree(work, ignore_errors=True)
    return {"env_s": record["env_s"], "verdict": record["verdict"], "status": record["status"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=2)
    times = parser.parse_args().times
    folders = torch_source.find_links(Settings.from_env())
    if not folders:
        sys.exit("no local wheel folder (pip's find-links) to compare against")
    base = Path(tempfile.mkdtemp(prefix="bench-torch_source-"))
    root = _checkout(base)
    lock_env = {**os.environ, "REPROBOX_ROOT": str(root), "REPROBOX_RESULTS": str(base / "r")}
    _run([*HARNESS, "lock", "toy"], lock_env)  # with find-links, as the committed locks are

    runs: dict[str, list[dict[str, object]]] = {"find_links": [], "http_index": []}
    fetched = 0
    with WheelIndex(folders) as index:
        off = {"PIP_CONFIG_FILE": os.devnull, "REPROBOX_TORCH_INDEX": index.url}
        for _ in range(times):  # alternate, so drift in the machine's load hits both alike
            runs["find_links"].append(
                _cold_run(root, base, {"PIP_FIND_LINKS": " ".join(folders)}, "links")
            )
            runs["http_index"].append(_cold_run(root, base, off, "index"))
        fetched = len(index.fetched("/files/torch-"))
    shutil.rmtree(base, ignore_errors=True)
    verdicts = {name: sorted({str(r["verdict"]) for r in rs}) for name, rs in runs.items()}
    emit({
        "cell": "toy clean (cpu), from its lock, cold caches",
        "env_creation_find_links": summarize([float(r["env_s"]) for r in runs["find_links"]]),
        "env_creation_http_index": summarize([float(r["env_s"]) for r in runs["http_index"]]),
        "verdicts": verdicts,
        "verdicts_equal": verdicts["find_links"] == verdicts["http_index"],
        "torch_wheel_downloads_from_index": fetched,
    })  # fmt: skip


if __name__ == "__main__":
    main()
