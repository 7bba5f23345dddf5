"""The GitHub Actions workflows: actionlint passes, actions are pinned, permissions are minimal,
no workflow input reaches a shell except through an environment variable, and each job would
pass on a stock runner: CPU jobs name the torch source, GPU jobs pick runners by GPU count."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from reprobox.envs import torch_source

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# What makes a job create repro environments (and so need the CPU build of torch).
CREATES_ENVS = (".ci/run", "make test", 'nox -s "$SESSION"', "nox -s bisect", "reprobox run",
                "nox -s report", "ensure_env")  # fmt: skip


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


def _jobs() -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(workflow file, job name, job, workflow) for every job."""
    found = []
    for path in WORKFLOWS:
        workflow = _load(path)
        for name, job in workflow["jobs"].items():
            found.append((path.name, name, job, workflow))
    return found


def _hosted(job: dict[str, Any]) -> bool:
    runs_on = job["runs-on"]
    return "self-hosted" not in (runs_on if isinstance(runs_on, list) else [runs_on])


@pytest.mark.parametrize("where", _jobs(), ids=lambda w: f"{w[0]}:{w[1]}")
def test_cpu_jobs_name_the_torch_source(where: tuple[str, str, dict, dict]) -> None:
    """A hosted runner has no local wheel folder: a job that creates environments from the
    committed CPU locks must point the harness at the PyTorch CPU index."""
    _, _, job, workflow = where
    steps = str(job.get("steps", []))
    if not _hosted(job) or not any(marker in steps for marker in CREATES_ENVS):
        return
    env = {**workflow.get("env", {}), **job.get("env", {})}
    assert env.get("REPROBOX_TORCH_INDEX") == torch_source.PYTORCH_CPU_INDEX
    # System packages through the one script that knows them (and the runner's sudo).
    for step in job["steps"]:
        assert "apt-get" not in step.get("run", ""), step


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_nothing_chowns_the_runners_folders(path: Path) -> None:
    for step in _steps(_load(path)):
        assert "chown" not in step.get("run", ""), step


def test_ci_runs_the_readme_test_command() -> None:
    test = _load(ROOT / ".github" / "workflows" / "ci.yml")["jobs"]["test"]
    runs = [step.get("run", "") for step in test["steps"]]
    assert runs[-1] == ".ci/run"
    ci_run = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci_run.splitlines() if line and not line.startswith("#")]
    assert commands[-1] == "exec make test"
    assert not any("apt-get" in line or "images/" in line for line in commands)
    # The image tests pull a base where a registry is reachable (no root-only local build).
    assert test["env"]["REPROBOX_BASE_IMAGE"].startswith("docker.io/")


def test_matrix_workflow_shape() -> None:
    workflow = _load(ROOT / ".github" / "workflows" / "matrix.yml")
    plan = workflow["jobs"]["plan"]
    scripts = "\n".join(step.get("run", "") for step in plan["steps"])
    assert "nox --json -l -t" in scripts and "reprobox ci-matrix" in scripts
    assert "default matrix" in str(plan["steps"])
    assert "fromJSON(needs.plan.outputs.cpu)" in workflow["jobs"]["cpu"]["strategy"]["matrix"]
    gpu = workflow["jobs"]["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu-${{ matrix.gpus }}"]  # a label per GPU count
    assert "nox -s image --" in str(gpu["steps"]) and "--platform gpu --run" in str(gpu["steps"])
    report = workflow["jobs"]["report"]
    assert set(report["needs"]) == {"plan", "cpu", "gpu"}
    runs = [step.get("run", "") for step in report["steps"]]
    assert 'nox -s report -- "$REPRO"' in runs  # with torch's collect_env: no --no-env
    assert not any("--no-env" in run for run in runs)
    assert any("ensure_env" in run for run in runs)  # the environments it reads


def test_ci_matrix_names_the_gpu_count() -> None:
    """The `gpus` of each GPU job (the runner label) is its variant's process count."""
    from reprobox.core import spec
    from reprobox.scaleout import jobs

    cell = {"repro": "lm_head", "variant": "default"}
    listed = [{"session": "repro_lm_head(default)", "call_spec": cell}]
    found = jobs.github_matrix(ROOT, listed)
    repro = spec.load(ROOT, "lm_head")
    assert found["gpu"]["include"], "lm_head has a GPU image"
    for row in found["gpu"]["include"]:
        assert row["gpus"] == repro.launch(row["variant"]).processes >= 1


def test_bisect_and_canary_shape() -> None:
    bisect = _load(ROOT / ".github" / "workflows" / "bisect.yml")
    inputs = bisect["on"]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"repro", "package", "good", "bad", "by_date", "float", "post_to"}
    for name in ("package", "good", "bad"):  # empty: repro.toml [bisect] decides
        assert not inputs[name].get("required") and inputs[name]["default"] == ""
    script = next(s["run"] for s in bisect["jobs"]["bisect"]["steps"] if s.get("name") == "Bisect")
    assert '--by-date "$BY_DATE"' in script and '--float "$package"' in script
    assert 'if [[ -n "$PACKAGE" ]]' in script  # an empty input is left out, not passed empty
    post = bisect["jobs"]["post"]
    assert post["permissions"] == {"contents": "read", "issues": "write"}
    assert "needs.bisect.result == 'success'" in post["if"] and "always()" not in post["if"]
    # posted through `report --post` (which makes the gist of the files the comment has no
    # room for), from the report the bisect job built, as it is
    assert 'reprobox report "$REPRO" --as-built --post "$POST_TO"' in str(post["steps"])
    assert "gh issue comment" not in str(bisect)
    canary = _load(ROOT / ".github" / "workflows" / "canary.yml")
    assert canary["on"]["schedule"]
    steps = str(canary["jobs"]["canary"]["steps"])
    assert "reprobox newest --as-pins" in steps and "upload-artifact" in steps


def test_canary_runs_the_planned_variant_at_each_newest_pin(tmp_path: Path) -> None:
    """The canary's two steps, run with a stand-in `reprobox` that prints its arguments: the
    package and its companions become one `--with` each on the planned variant's run."""
    steps = _load(ROOT / ".github" / "workflows" / "canary.yml")["jobs"]["canary"]["steps"]
    newest = next(s for s in steps if s.get("id") == "newest")
    run = next(s for s in steps if "--variant" in s.get("run", ""))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "reprobox").write_text(
        '#!/bin/sh\nif [ "$1" = newest ]; then shift 2; for p; do printf "%s==9 " "$p"; done;'
        ' echo; else printf "%s\\n" "$@"; fi\n'
    )
    (fake / "reprobox").chmod(0o755)
    out = tmp_path / "github_output"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "GITHUB_OUTPUT": str(out), "PACKAGE": "transformers",
           "WITH": "accelerate datasets"}  # fmt: skip
    done = subprocess.run(["bash", "-e", "-c", newest["run"]], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pins = out.read_text().strip().removeprefix("pins=")
    assert pins.split() == ["transformers==9", "accelerate==9", "datasets==9"]
    env = {"PATH": f"{fake}:/usr/bin:/bin", "REPRO": "ga_grad", "VARIANT": "fixed", "PINS": pins}
    done = subprocess.run(["bash", "-e", "-c", run["run"]], env=env, capture_output=True, text=True)
    assert run["env"]["VARIANT"] == "${{ matrix.variant }}"
    assert done.stdout.split() == ["run", "ga_grad", "--variant", "fixed",
                                   "--with", "transformers==9", "--with", "accelerate==9",
                                   "--with", "datasets==9"], done.stderr  # fmt: skip


def test_bisect_with_empty_inputs_runs_the_defaults(tmp_path: Path) -> None:
    """The Bisect step's script with every optional input empty passes the repro alone."""
    bisect = _load(ROOT / ".github" / "workflows" / "bisect.yml")
    script = next(s["run"] for s in bisect["jobs"]["bisect"]["steps"] if s.get("name") == "Bisect")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nox").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / "nox").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "REPRO": "kl", "PACKAGE": "", "GOOD": "", "BAD": "",
           "BY_DATE": "", "FLOAT": ""}  # fmt: skip
    done = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["-s", "bisect", "--", "kl"], done.stderr
    env |= {"BY_DATE": "2023-07-01..2023-11-30", "FLOAT": "trl accelerate"}
    done = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["-s", "bisect", "--", "kl", "--by-date",
                                   "2023-07-01..2023-11-30", "--float", "trl", "--float",
                                   "accelerate"]  # fmt: skip


def test_uploads_are_scrubbed_exports_never_the_raw_results() -> None:
    """Rank logs can hold secrets: a job uploads what `reprobox export` wrote (or a report,
    scrubbed as it is written), never the results folder itself."""
    uploads = 0
    for path in WORKFLOWS:
        for name, job in _load(path)["jobs"].items():
            steps = job.get("steps", [])
            for index, step in enumerate(steps):
                if not str(step.get("uses", "")).startswith("actions/upload-artifact"):
                    continue
                uploads += 1
                where = f"{path.name} {name}: {step.get('name')}"
                target = str(step["with"]["path"]).rstrip("/")
                if target.endswith("/_report"):
                    continue
                assert target == "export", where
                before = " ".join(str(s.get("run", "")) for s in steps[:index])
                assert re.search(r"reprobox export .*-o export/", before), where
    assert uploads >= 5


SUITE = """\
import pathlib, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "TOKEN"])
def torn(*_):
    pathlib.Path(sys.argv[1]).write_text("down")
    child.terminate()
    sys.exit(130)
signal.signal(signal.SIGINT, torn)
pathlib.Path(sys.argv[1] + ".up").write_text("up")
time.sleep(600)
"""


def test_make_test_runs_the_suite_in_a_process_group_of_its_own() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ntest: ", 1)[1].splitlines()[1]
    assert recipe.strip().startswith("$(BIN)/python scripts/process_group.py $(NOX) -s tests")


def test_a_signal_to_make_test_tears_the_whole_suite_down(tmp_path: Path) -> None:
    """`kill` on the suite's runner (a cancelled CI job, make passing a TERM on) reaches
    pytest as a SIGINT and leaves no process behind: the real script `make test` runs the
    suite through, with a stand-in suite that answers SIGINT by tearing down."""
    token = f"reprobox-ci-run-{tmp_path.name}"
    torn = tmp_path / "torn"
    suite = [sys.executable, "-c", SUITE.replace("TOKEN", token), str(torn), token]
    group = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "process_group.py"), *suite])
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{torn}.up").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(token), "the stand-in suite did not start"
        group.send_signal(signal.SIGTERM)
        assert group.wait(timeout=60) == 143
        assert torn.read_text() == "down"  # the suite heard SIGINT and tore down
        deadline = time.monotonic() + 10
        while _alive(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(token) == []
    finally:
        for process in _alive(token):
            process.kill()
        if group.poll() is None:
            group.kill()


def _alive(token: str) -> list[psutil.Process]:
    """The processes whose command line holds `token`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if token in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found
