"""`reprobox k8s --image`: one image serves only cells of one environment. Put on cells
whose pins differ (a matrix's other releases), each of them would measure the image's
packages and give a verdict about them: refused in one line, unless --image-for-all,
which is then said on stderr. Through the CLI, as a user types it."""

from __future__ import annotations

from pathlib import Path

import yaml
from test_report import FAKE_TOML, fake_repro

from conftest import reprobox

IMAGE = "reg.example/rb/ppo@sha256:" + "a" * 64


def _jobs(text: str) -> list[dict]:
    return [o for o in yaml.safe_load_all(text) if o and o["kind"] == "Job"]


def test_an_image_for_cells_of_other_pins_is_refused(scratch_root: Path) -> None:
    fake_repro(scratch_root)
    done = reprobox("k8s", "ppo", "--platform", "cpu", "--image", IMAGE)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no manifest to apply by mistake
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"reprobox: error: --image {IMAGE} would run 6 cells that need ")
    assert "2 different environments" in line and "trl==0.7." in line
    assert "--image-for-all" in line and "Traceback" not in done.stderr


def test_image_for_all_runs_them_all_and_says_so(scratch_root: Path) -> None:
    fake_repro(scratch_root)
    done = reprobox("k8s", "ppo", "--platform", "cpu", "--image", IMAGE, "--image-for-all")
    assert done.returncode == 0, done.stderr
    [job] = _jobs(done.stdout)
    assert job["spec"]["completions"] == 6
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    [warning] = done.stderr.strip().splitlines()
    assert warning.startswith("reprobox: warning: --image-for-all: 6 cells of 2 environments")


def test_cells_of_one_environment_take_one_image(scratch_root: Path) -> None:
    """A variant that changes only the script's arguments shares the lock: no refusal."""
    directory = fake_repro(scratch_root)
    toml = FAKE_TOML.replace('pins = ["trl==0.7.2"]', "pins = []").split("[matrix]")[0]
    (directory / "repro.toml").write_text(toml)
    done = reprobox("k8s", "ppo", "--platform", "cpu", "--image", IMAGE)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    [job] = _jobs(done.stdout)
    assert job["spec"]["completions"] == 2


def test_image_for_all_without_an_image_is_bad_input(scratch_root: Path) -> None:
    fake_repro(scratch_root)
    done = reprobox("k8s", "ppo", "--platform", "cpu", "--image-for-all")
    assert done.returncode == 2
    assert done.stderr.strip() == "reprobox: error: --image-for-all goes with --image IMAGE"
