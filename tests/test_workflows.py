"""The GitHub Actions workflows: actionlint passes, actions are pinned, permissions are minimal,
and no workflow input reaches a shell except through an environment variable."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> str:
    """The binary the `test` extra installs next to this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "actionlint"
    found = str(beside) if beside.is_file() else shutil.which("actionlint")
    if found is None:
        pytest.fail("actionlint is not installed; `pip install -e '.[test]'`")
    return found


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def test_the_four_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "matrix.yml", "bisect.yml", "canary.yml"}


def test_actionlint_passes() -> None:
    done = subprocess.run(
        [_actionlint(), "-no-color", *map(str, WORKFLOWS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_pinned_and_permissions_minimal(path: Path) -> None:
    workflow = _load(path)
    assert workflow["permissions"] == {"contents": "read"}
    for name, job in workflow["jobs"].items():
        granted = job.get("permissions", {})
        assert set(granted) <= {"contents", "issues"}, f"{name} asks for {granted}"
    for step in _steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+(\.\d+)*", step["uses"]), step["uses"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_inputs_reach_shells_only_through_env(path: Path) -> None:
    """`${{ inputs.x }}` inside `run:` would let an input inject shell code."""
    for step in _steps(_load(path)):
        script = step.get("run", "")
        assert not re.search(r"\$\{\{\s*(inputs|matrix|github\.event)\.", script), script


def test_matrix_workflow_shape() -> None:
    workflow = _load(ROOT / ".github" / "workflows" / "matrix.yml")
    plan = workflow["jobs"]["plan"]
    scripts = "\n".join(step.get("run", "") for step in plan["steps"])
    assert "nox --json -l -t" in scripts and "reprobox ci-matrix" in scripts
    assert "default matrix" in str(plan["steps"])
    assert "fromJSON(needs.plan.outputs.cpu)" in workflow["jobs"]["cpu"]["strategy"]["matrix"]
    gpu = workflow["jobs"]["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu"]
    assert "nox -s image --" in str(gpu["steps"]) and "--platform gpu --run" in str(gpu["steps"])
    report = workflow["jobs"]["report"]
    assert set(report["needs"]) == {"plan", "cpu", "gpu"}
    assert "nox -s report --" in str(report["steps"])


def test_bisect_and_canary_shape() -> None:
    bisect = _load(ROOT / ".github" / "workflows" / "bisect.yml")
    inputs = bisect["on"]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"repro", "package", "good", "bad", "post_to"}
    assert bisect["jobs"]["post"]["permissions"] == {"contents": "read", "issues": "write"}
    assert "gh issue comment" in str(bisect["jobs"]["post"]["steps"])
    canary = _load(ROOT / ".github" / "workflows" / "canary.yml")
    assert canary["on"]["schedule"]
    steps = str(canary["jobs"]["canary"]["steps"])
    assert "reprobox newest" in steps and "--variant fixed --with" in steps
    assert "upload-artifact" in steps
