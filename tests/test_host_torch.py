"""The host's torch (REPROBOX_TORCH_SOURCE=host): a GPU cluster's own CUDA build of torch,
used by a venv that installs the lock without torch and its CUDA wheels.

The "host" here is a real uv venv holding this machine's CPU torch wheel (pip's find-links
folder; uv's cache makes it quick): the same shape as a venv or conda host of a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, newest_records, reprobox
from reprobox.core.errors import BadInput, EnvError, ExitCode
from reprobox.core.records import Record
from reprobox.core.settings import Settings
from reprobox.core.spec import load
from reprobox.envs import locks, torch_source, venvs
from reprobox.envs.uv import uv_bin
from reprobox.report import env_commands

# its module-scoped fixture is built once: all of it on one worker
pytestmark = pytest.mark.xdist_group("tests/test_host_torch.py")

HOST_TORCH = "2.13.0+cpu"


def _host_venv(where: Path, with_torch: bool = True) -> Path:
    """A uv venv as the host's python; with the local CPU torch wheel installed (or none)."""
    subprocess.run([uv_bin(), "venv", "-q", "--python", "3.11", str(where)], check=True)
    python = where / "bin" / "python"
    if with_torch:
        folders = torch_source.find_links(Settings.from_env())
        if not any(Path(f).glob(f"torch-{HOST_TORCH}-*.whl") for f in folders):
            pytest.fail("no CPU torch wheel in pip's find-links folders to build a host from")
        links = [a for f in folders for a in ("--find-links", f)]
        cmd = [uv_bin(), "pip", "install", "-q", "--python", str(python), *links]
        subprocess.run([*cmd, f"torch=={HOST_TORCH}", "numpy<2"], check=True)
    return python


@pytest.fixture(scope="module")
def host_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _host_venv(tmp_path_factory.mktemp("host") / "venv")


@pytest.fixture
def host_env(host_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Host mode, with a cache of the test's own."""
    monkeypatch.setenv("REPROBOX_TORCH_SOURCE", "host")
    monkeypatch.setenv("REPROBOX_HOST_PYTHON", str(host_python))
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))
    torch_source.probe_host.cache_clear()
    yield host_python
    torch_source.probe_host.cache_clear()


def _toy(root: Path, host_torch: str | None, host_packages: str = "") -> None:
    toml = root / "repros" / "toy" / "repro.toml"
    if host_torch is not None:
        more = f"host_packages = {host_packages}\n" if host_packages else ""
        toml.write_text(
            toml.read_text() + f'\n[platforms.cpu]\nhost_torch = "{host_torch}"\n{more}'
        )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("reprobox: error:")]


# ---- the host flavour of a lock --------------------------------------------------------------


def test_the_host_flavour_drops_torch_and_every_cuda_wheel_of_the_gpu_locks() -> None:
    for lock in sorted((ROOT / "repros").glob("*/locks/*.gpu.txt")):
        text = lock.read_text().partition("\n")[2]
        kept, dropped = locks.without_host_torch(text)
        pins = venvs.lock_pins(kept)
        assert "torch" in dropped and "triton" in dropped, lock
        assert not [n for n in pins if n.startswith(("nvidia-", "cuda-")) or n == "torch"]
        # everything else of the lock stays, hashes and all
        assert set(pins) | set(dropped) == set(venvs.lock_pins(text)), lock
        assert "--hash=sha256:" in kept
    kl = (ROOT / "repros" / "kl" / "locks" / "broken.gpu.txt").read_text().partition("\n")[2]
    kept, dropped = locks.without_host_torch(kl)
    # what only torch needs comes with the host's torch; anything another package needs stays
    assert {"sympy", "mpmath", "networkx", "jinja2", "markupsafe"} <= set(dropped)
    assert {"filelock", "fsspec", "typing-extensions", "trl", "deepspeed"} <= set(
        venvs.lock_pins(kept)
    )
    shared = "a==1 \\\n    # via torch\nb==1 \\\n    # via\n    #   a\n    #   c\nc==1\ntorch==2\n"
    assert locks.without_host_torch(shared)[1] == ["a", "torch"]  # b is also c's: kept
    nvml = "nvidia-ml-py==12.0 \\\n    --hash=sha256:00\ntorch==2.1.0 \\\n    --hash=sha256:11\n"
    assert locks.without_host_torch(nvml) == (
        "nvidia-ml-py==12.0 \\\n    --hash=sha256:00\n",
        ["torch"],
    )


def test_the_host_lock_is_derived_offline_hashed_and_cached(tmp_path: Path) -> None:
    settings = Settings.from_env({"REPROBOX_CACHE": str(tmp_path), "REPROBOX_ROOT": str(ROOT)})
    base = ROOT / "repros" / "lm_head" / "locks" / "broken.gpu.txt"
    host = locks.host_lock(base, settings)
    assert host.parent == tmp_path / "locks"
    assert locks.body_problem(host) is None  # headed and body-hashed like every lock
    assert locks.lock_input_hash(host) not in (None, locks.lock_input_hash(base))
    assert "torch" not in venvs.lock_pins(host.read_text())
    assert "transformers" in venvs.lock_pins(host.read_text())
    stamp = host.stat().st_mtime_ns
    assert locks.host_lock(base, settings) == host and host.stat().st_mtime_ns == stamp
    edited = tmp_path / "edited.txt"
    edited.write_text(base.read_text().replace("transformers==", "transformers===", 1))
    with pytest.raises(EnvError) as refused:
        locks.host_lock(edited, settings)
    assert refused.value.exit_code == ExitCode.INTEGRITY


def test_an_override_in_host_mode_resolves_as_pypi_then_drops_torch() -> None:
    cpu = locks.LockRequest(("torch==2.13.0+cpu",), "3.11")
    assert locks.for_torch_source(cpu, "host").torch_source == "pypi"
    gpu = locks.LockRequest(("torch==2.13.0",), "3.11", platform="gpu")
    assert locks.for_torch_source(gpu, "host") is gpu


# ---- the range a repro states ----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["2.1", ">=two", ""])
def test_a_bad_host_torch_range_is_bad_input_naming_the_field(toy_root: Path, bad: str) -> None:
    _toy(toy_root, bad)
    with pytest.raises(BadInput, match=r"platforms\.cpu\.host_torch.*not a version range"):
        load(toy_root, "toy")


@pytest.mark.parametrize(
    ("packages", "error"),
    [
        ('{ numpy = "2" }', r"platforms\.cpu\.host_packages\.numpy.*not a version range"),
        ('{ torch = ">=2" }', r"platforms\.cpu\.host_packages.*torch's range is host_torch"),
    ],
)
def test_bad_host_packages_are_bad_input_naming_the_field(
    toy_root: Path, packages: str, error: str
) -> None:
    _toy(toy_root, ">=2", packages)
    with pytest.raises(BadInput, match=error):
        load(toy_root, "toy")


def test_the_host_flavour_also_drops_the_platforms_host_packages() -> None:
    kl = (ROOT / "repros" / "kl" / "locks" / "zero2_bf16_1gpu.gpu.txt").read_text()
    kept, dropped = locks.without_host_torch(kl.partition("\n")[2], ["numpy", "PyArrow"])
    assert {"numpy", "pyarrow", "torch"} <= set(dropped)
    assert {"datasets", "pandas", "trl"} <= set(venvs.lock_pins(kept))  # theirs to need


def test_the_committed_repros_state_a_range_for_their_gpu_platform() -> None:
    for name in ("kl", "lm_head"):
        repro = load(ROOT, name)
        wanted = repro.platform("gpu").host_torch_range
        assert wanted is not None and "2.9.1" in wanted and "1.8.0" not in wanted, name


# ---- the host's interpreter ------------------------------------------------------------------


def test_the_probe_reads_the_host_torch(host_python: Path) -> None:
    torch_source.probe_host.cache_clear()
    host = torch_source.probe_host(str(host_python))
    assert (host.version, host.cuda, host.python_version) == (HOST_TORCH, None, "3.11")
    assert Path(host.site) == host_python.parent.parent / "lib" / "python3.11" / "site-packages"
    assert host.describe("3.10") == (
        "host: torch 2.13.0+cpu (no CUDA), python 3.11 (the lock's python is 3.10)"
    )
    assert host.record("3.10")["lock_python"] == "3.10" and host.record("3.11")["cuda"] == "none"


def test_a_host_python_that_is_missing_or_does_not_run_is_an_environment_error(
    tmp_path: Path,
) -> None:
    torch_source.probe_host.cache_clear()
    with pytest.raises(EnvError, match="no such interpreter"):
        torch_source.probe_host(str(tmp_path / "nope" / "python"))
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'not a python' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(EnvError, match="does not run as a python: not a python") as raised:
        torch_source.probe_host(str(fake))
    assert raised.value.exit_code == ExitCode.ENV_FAILED


# ---- end to end ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_lm_head_runs_with_the_host_torch(
    host_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real repro on the host's torch: the expected verdicts, a venv with no torch of its
    own that imports the host's, and records that name it."""
    monkeypatch.setenv("REPROBOX_ROOT", str(ROOT))
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "results"))
    done = reprobox("run", "lm_head", "--variant", "broken", "--variant", "fixed")
    assert done.returncode == ExitCode.OK, done.stderr
    records = newest_records(tmp_path / "results", "lm_head")
    assert {label: r["verdict"] for label, r in records.items()} == {
        "broken": "reproduced",
        "fixed": "clean",
    }
    host_site = host_env.parent.parent / "lib" / "python3.11" / "site-packages"
    for record in records.values():
        assert record["torch_source"] == "host: torch 2.13.0+cpu (no CUDA), python 3.11"
        host = record["host_torch"]
        assert (host["version"], host["cuda"], host["path"]) == (HOST_TORCH, "none", str(host_site))
        assert record["lock"].endswith("broken.cpu.txt") or record["lock"].endswith("fixed.cpu.txt")
        assert "torch" not in venvs.lock_pins(Path(host["lock"]).read_text())
    env = Path(records["broken"]["command"][0]).parent.parent
    site = venvs.site_packages(env)
    assert site is not None and not list(site.glob("torch*")), "the venv has a torch of its own"
    imported = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import torch, transformers; "
         "print(torch.__file__); print(transformers.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert Path(imported[0]).is_relative_to(host_site)
    assert imported[1] == "4.32.1"  # the lock's pin, not anything of the host's
    # the report's environment section: the host's torch, and what the venv imports
    record = Record.model_validate(records["broken"])
    python = env / "bin" / "python"
    listed = env_commands.packages(python, env_commands._env(python, {}), 120)
    assert (listed["torch"], listed["transformers"]) == (HOST_TORCH, "4.32.1")
    shown = env_commands.host_torch_report(record)
    assert f"torch {HOST_TORCH} (CUDA none)" in shown.text and str(host_site) in shown.text


@pytest.mark.e2e
def test_a_host_torch_outside_the_range_is_cannot_test(toy_root: Path, host_env: Path) -> None:
    _toy(toy_root, "<2.13")
    done = reprobox("verdict", "toy", "--variant", "clean")
    assert done.returncode == 125, done.stderr
    [record] = newest_records(toy_root / "results", "toy").values()
    assert record["verdict"] == "cannot_test" and record["host_torch"]["version"] == HOST_TORCH
    assert record["reason"] == (
        "cannot test here: the host's torch 2.13.0+cpu is outside the range toy accepts on "
        "platform cpu (host_torch = <2.13)"
    )
    assert not (Path(record["dir"]) / "launch.log").exists()  # never launched
    assert "Traceback" not in done.stderr
    # `run` says the same: no verdict about the bug missed, but a cell could not be tested
    assert reprobox("run", "toy", "--variant", "clean").returncode == 125


@pytest.mark.e2e
@pytest.mark.slow
def test_a_changed_host_torch_rebuilds_the_venv(
    toy_root: Path, host_env: Path, tmp_path: Path
) -> None:
    """Same interpreter, torch moved to another folder: the venv's `.pth` would name a
    folder that no longer holds it, so the venv is rebuilt, and says why."""
    _toy(toy_root, ">=2.1")
    host = _host_venv(tmp_path / "host")
    env = dict(os.environ, REPROBOX_HOST_PYTHON=str(host))
    built = subprocess.run(
        [sys.executable, "-m", "reprobox", "run", "toy", "--variant",
         "clean"], capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert built.returncode == ExitCode.OK, built.stderr
    site = host.parent.parent / "lib" / "python3.11" / "site-packages"
    moved = tmp_path / "moved"
    moved.mkdir()
    for entry in site.glob("torch*"):
        shutil.move(str(entry), moved / entry.name)
    env["PYTHONPATH"] = str(moved)  # a module system's way of giving torch
    again = subprocess.run(built.args, capture_output=True, text=True, env=env)
    assert again.returncode == ExitCode.OK, again.stderr
    records = sorted((toy_root / "results" / "toy").glob("*/*/record.json"))
    last = json.loads(records[-1].read_text())
    assert last["runner"].startswith("venv (rebuilt: the host's torch changed (2.13.0+cpu at ")
    assert last["host_torch"]["path"] == str(moved)


@pytest.mark.e2e
@pytest.mark.e2e
def test_host_packages_come_from_the_host_and_are_checked(toy_root: Path, host_env: Path) -> None:
    """numpy taken from the host with its torch: not installed in the venv, the host's seen
    and recorded; out of its range, or absent from the host, the cell cannot be tested."""
    toml = toy_root / "repros" / "toy" / "repro.toml"
    original = toml.read_text()
    _toy(toy_root, ">=2.1", '{ numpy = ">=1.20,<2" }')
    done = reprobox("run", "toy", "--variant", "clean")
    assert done.returncode == ExitCode.OK, done.stderr
    [record] = newest_records(toy_root / "results", "toy").values()
    host_numpy = record["host_torch"]["package numpy"]
    assert host_numpy.startswith("1.") and str(host_env.parent.parent) in host_numpy
    assert record["torch_source"].startswith(
        "host: torch 2.13.0+cpu (no CUDA), python 3.11, numpy 1."
    )
    env = Path(record["command"][0]).parent.parent
    site = venvs.site_packages(env)
    assert site is not None and not list(site.glob("numpy*")), "the venv has a numpy of its own"
    assert "numpy" not in venvs.lock_pins(Path(record["host_torch"]["lock"]).read_text())

    toml.write_text(original)
    _toy(toy_root, ">=2.1", '{ numpy = ">=2" }')
    done = reprobox("run", "toy", "--variant", "clean")
    assert done.returncode == ExitCode.CANNOT_TEST, done.stderr
    [record] = newest_records(toy_root / "results", "toy").values()
    assert record["verdict"] == "cannot_test"
    assert record["reason"].startswith("cannot test here: the host's numpy 1.")
    assert record["reason"].endswith(
        "is outside the range toy accepts on platform cpu (host_packages.numpy = >=2)"
    )

    toml.write_text(original)
    _toy(toy_root, ">=2.1", '{ pyarrow = ">=15" }')
    done = reprobox("run", "toy", "--variant", "clean")
    assert done.returncode == ExitCode.CANNOT_TEST, done.stderr
    [record] = newest_records(toy_root / "results", "toy").values()
    assert record["reason"] == (
        "cannot test here: the host has no pyarrow, which toy's [platforms.cpu] host_packages "
        "takes from it"
    )
    assert "Traceback" not in done.stderr


def test_host_mode_failures_are_one_line(toy_root: Path, host_env: Path, tmp_path: Path) -> None:
    """No range stated: bad input (2). A host python without torch: environment (3). A bad
    range: bad input (2), naming the field."""
    no_range = reprobox("run", "toy", "--variant", "clean")
    assert no_range.returncode == ExitCode.BAD_INPUT, no_range.stderr
    assert _error_lines(no_range.stderr)[-1].endswith(
        "REPROBOX_TORCH_SOURCE=host: toy states no host_torch range for platform cpu "
        '(add host_torch = ">=X.Y" under [platforms.cpu] in repro.toml)'
    )
    _toy(toy_root, ">=2.1")
    bare = _host_venv(tmp_path / "bare", with_torch=False)
    env = dict(os.environ, REPROBOX_HOST_PYTHON=str(bare))
    no_torch = subprocess.run(
        [sys.executable, "-m", "reprobox", "run", "toy", "--variant", "clean"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert no_torch.returncode == ExitCode.ENV_FAILED, no_torch.stderr
    [line] = _error_lines(no_torch.stderr)
    assert "has no usable torch: ModuleNotFoundError: No module named 'torch'" in line
    assert "Traceback" not in no_torch.stderr
    toml = toy_root / "repros" / "toy" / "repro.toml"
    toml.write_text(toml.read_text().replace('host_torch = ">=2.1"', 'host_torch = "2.1"'))
    bad = reprobox("run", "toy", "--variant", "clean")
    assert bad.returncode == ExitCode.BAD_INPUT
    assert bad.stderr.strip().splitlines()[-1].startswith("reprobox: error: ")
    assert "platforms.cpu.host_torch" in bad.stderr and "Traceback" not in bad.stderr
