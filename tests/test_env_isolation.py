"""The harness's environment stays with the harness (issue 11, item 14): ranks, the preflight
and uv (with the source builds it runs) get an explicit set of variables plus
`[launch] pass_env`, and each record names (never values) what its processes got."""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from conftest import FIXTURES, newest_records, reprobox
from reprobox.core import env_filter
from reprobox.core.errors import SpecError
from reprobox.core.settings import Settings
from reprobox.envs import uv

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "GH_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz0123456",
    "TORCH_HUB_TOKEN": "secret-under-an-allowed-prefix-1",
}
HARMLESS = {"REPROBOX_TEST_HARMLESS": "not asked for", "REPROBOX_TEST_PASSED": "asked for"}


def test_launch_set_keeps_the_stack_and_drops_the_rest() -> None:
    parent = {
        **SECRETS, **HARMLESS, "PATH": "/usr/bin", "HOME": "/h", "LC_ALL": "C.UTF-8",
        "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0",
        "HF_HUB_OFFLINE": "1", "HTTPS_PROXY": "http://proxy:3128", "UV_INDEX_URL": "x",
        "PIP_INDEX_URL": "y", "REPROBOX_RESULTS": "/r", "SSH_AUTH_SOCK": "/s",
    }  # fmt: skip
    got = env_filter.for_launch(parent)
    assert set(got) == {
        "PATH", "HOME", "LC_ALL", "NCCL_DEBUG", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
        "HF_HUB_OFFLINE", "HTTPS_PROXY",
    }  # fmt: skip
    assert env_filter.for_launch(parent, ["REPROBOX_TEST_PASSED", "HF_TOKEN"]).keys() - got == {
        "REPROBOX_TEST_PASSED", "HF_TOKEN",  # asked for by name: the repro's own decision
    }  # fmt: skip
    for_uv = env_filter.for_uv(parent)
    assert {"UV_INDEX_URL", "HTTPS_PROXY", "PATH"} <= set(for_uv)
    assert not set(for_uv) & {*SECRETS, *HARMLESS, "PIP_INDEX_URL", "HF_HUB_OFFLINE"}


def test_pass_env_names_are_checked(tmp_path: Path) -> None:
    from reprobox.core import spec

    root = tmp_path / "checkout"
    shutil.copytree(FIXTURES / "repros" / "envdump", root / "repros" / "envdump")
    (root / "fixes").mkdir()
    toml = root / "repros" / "envdump" / "repro.toml"
    toml.write_text(toml.read_text().replace('"REPROBOX_TEST_PASSED"', '"NOT A NAME"'))
    with pytest.raises(SpecError, match="pass_env"):
        spec.load(root, "envdump")


@pytest.fixture
def planted(scratch_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The envdump repro in a scratch checkout, secrets and harmless values in the
    harness's environment."""
    shutil.copytree(FIXTURES / "repros" / "envdump", scratch_root / "repros" / "envdump")
    for name, value in {**SECRETS, **HARMLESS}.items():
        monkeypatch.setenv(name, value)
    return scratch_root


def _names_seen(run_dir: Path) -> dict[str, set[str]]:
    """Who printed which variable names (rank0, rank1, preflight), from the run's logs."""
    seen: dict[str, set[str]] = {}
    for log in run_dir.rglob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("ENV-NAMES "):
                who, _, names = line[len("ENV-NAMES ") :].partition(": ")
                seen[who] = set(names.split())
    return seen


@pytest.mark.e2e
def test_ranks_and_preflight_see_no_secret_of_the_harness(planted: Path) -> None:
    done = reprobox("run", "envdump")
    assert done.returncode == 0, done.stdout + done.stderr
    record = newest_records(planted / "results", "envdump")["clean"]
    seen = _names_seen(Path(record["dir"]))
    assert set(seen) == {"rank0", "rank1", "preflight"}, seen
    for who, names in seen.items():
        assert not names & {*SECRETS, "REPROBOX_TEST_HARMLESS"}, who
        assert "REPROBOX_TEST_PASSED" in names, who  # [launch] pass_env
        assert {"PATH", "HOME", "REPRO_CACHE", "REPROBOX_RUN_ID"} <= names, who
    assert {"REPRO_RESULT", "RANK", "WORLD_SIZE"} <= seen["rank0"]
    # The record names what the ranks got, and nothing of the values.
    assert set(record["env_names"]) == seen["rank0"]
    text = json.dumps(record)
    assert not any(value in text for value in SECRETS.values())


@pytest.mark.e2e
def test_a_uv_source_build_sees_no_secret_of_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup.py of any sdist a bisect builds runs under uv: it gets uv's set only."""
    for name, value in {**SECRETS, **HARMLESS}.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "names.txt"
    package = tmp_path / "nosy"
    package.mkdir()
    (package / "setup.py").write_text(
        textwrap.dedent(f"""\
        import os
        from setuptools import setup
        with open({str(dump)!r}, "w") as handle:
            handle.write(" ".join(sorted(os.environ)))
        setup(name="nosy", version="0.1", py_modules=[])
    """)
    )
    settings = dataclasses.replace(Settings.from_env(), cache=tmp_path / "cache")
    venv = tmp_path / "venv"
    uv.run_uv([uv.uv_bin(), "venv", "--quiet", "--python", "3.11", str(venv)],
              what="create venv", settings=settings)  # fmt: skip
    uv.run_uv(
        [uv.uv_bin(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
         "--no-cache", str(package)],
        what="install", settings=settings, env={"DS_BUILD_OPS": "0"},
    )  # fmt: skip
    names = set(dump.read_text().split())
    assert "DS_BUILD_OPS" in names  # [env] install_env still reaches the build
    assert not names & {*SECRETS, *HARMLESS}, names & {*SECRETS, *HARMLESS}
    assert "PATH" in names
