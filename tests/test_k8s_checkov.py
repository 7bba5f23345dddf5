"""checkov, the policy checker clusters gate manifests with, on what `reprobox k8s` prints:
the Jobs of every cell and the collector pod, with --namespace 0 failed checks; without it
one check (no default namespace) is skipped by an annotation in the manifest that says why.
Run on the YAML the CLI writes, as a cluster's admission pipeline would.

checkov is not in the test extra: it pins packaging below 24, and installed beside reprobox it
downgrades packaging under reprobox and pytest (pip check then fails). It runs instead in a
tool environment of its own, `uv tool run` (uv is one of reprobox's dependencies): the first
run installs it into uv's cache (about a minute), later ones only start it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_report import fake_repro

from conftest import reprobox

IMAGE = "reg.example/rb/ppo@sha256:" + "a" * 64
CHECKOV_VERSION = "3.3.30"
UV = str(Path(sys.executable).with_name("uv"))
pytestmark = pytest.mark.e2e  # an outside tool, installed on first use: not the unit tier


def _checkov(folder: Path) -> dict[str, dict[str, Any]]:
    """One checkov run over every manifest in `folder` (it starts slowly: once for all):
    per file name, the passed count and the failed and skipped check ids."""
    uv = UV if Path(UV).is_file() else shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not installed: `pip install -e .[test]` installs it")
    checkov = [uv, "tool", "run", "--from", f"checkov=={CHECKOV_VERSION}", "checkov"]
    argv = [*checkov, "-d", str(folder), "--framework", "kubernetes", "--output", "json"]
    done = subprocess.run([*argv, "--skip-download"], capture_output=True, text=True, timeout=600)
    assert done.stdout.strip(), done.stderr
    found = json.loads(done.stdout)
    results = (found[0] if isinstance(found, list) else found)["results"]
    files: dict[str, dict[str, Any]] = {}
    for kind in ("passed", "failed", "skipped"):
        for check in results[f"{kind}_checks"]:
            name = Path(check["file_path"]).stem
            entry = files.setdefault(name, {"passed": 0, "failed": set(), "skipped": set()})
            if kind == "passed":
                entry["passed"] += 1
            else:
                entry[kind].add(check["check_id"])
    return files


def _write(folder: Path, name: str, *argv: str) -> Path:
    done = reprobox("k8s", "ppo", "--platform", "cpu", *argv)
    assert done.returncode == 0, done.stderr
    assert [o["kind"] for o in yaml.safe_load_all(done.stdout) if o][-1] == "NetworkPolicy"
    path = folder / f"{name}.yaml"
    path.write_text(done.stdout)
    return path


def test_checkov_passes_the_manifests_and_can_fail(scratch_root: Path, tmp_path: Path) -> None:
    fake_repro(scratch_root)
    folder = tmp_path / "manifests"
    folder.mkdir()
    kinds = {
        "job": ("--image", IMAGE, "--image-for-all"),
        "collector": ("--image", IMAGE, "--collector"),
    }
    for kind, argv in kinds.items():
        _write(folder, f"{kind}-named", *argv, "--namespace", "ml")
        _write(folder, f"{kind}-bare", *argv)
    # the check bites: a collector without its probes, and no policy selecting it, fails
    named = (folder / "collector-named.yaml").read_text()
    pod = next(o for o in yaml.safe_load_all(named) if o and o["kind"] == "Pod")
    for probe in ("readinessProbe", "livenessProbe"):
        del pod["spec"]["containers"][0][probe]
    pod["metadata"]["labels"] = {"app": "other"}  # no NetworkPolicy of ours selects it
    (folder / "weakened.yaml").write_text(yaml.safe_dump(pod))

    files = _checkov(folder)
    for kind in kinds:
        named_result, bare = files[f"{kind}-named"], files[f"{kind}-bare"]
        assert named_result["failed"] == set() and named_result["skipped"] == set(), kind
        assert named_result["passed"] > 50, kind  # the checks ran
        assert bare["failed"] == set(), kind
        assert bare["skipped"] == {"CKV_K8S_21"}, kind  # the context's namespace, said so
    assert files["weakened"]["failed"] == {"CKV_K8S_8", "CKV_K8S_9", "CKV2_K8S_6"}
