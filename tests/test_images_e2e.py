"""Real image builds and runs with podman (or docker): the container reaches the venv path's
verdicts, a run past its timeout is killed and removed, and a tampered lock never builds.

Needs a container engine: .ci/run installs podman (images/setup-podman.sh) and builds the
local base image. Where no engine can be had, set REPROBOX_SKIP_CONTAINERS=1 to leave these
tests out knowingly; without it they fail rather than skip silently.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, newest_records, reprobox
from reprobox.core import spec
from reprobox.core.errors import EnvError, ExitCode
from reprobox.run.backends import container as images
from reprobox.run.pipeline import lock_path

pytestmark = [pytest.mark.e2e, pytest.mark.container]
BASE = os.environ.get("REPROBOX_BASE_IMAGE", "localhost/reprobox-base:bookworm-py3.11")


@pytest.fixture(scope="module")
def engine() -> images.Engine:
    try:
        found = images.find_engine()
    except Exception as exc:
        if os.environ.get("REPROBOX_SKIP_CONTAINERS") == "1":
            pytest.skip(f"REPROBOX_SKIP_CONTAINERS=1: {exc}")
        pytest.fail(f"{exc} (or set REPROBOX_SKIP_CONTAINERS=1 to leave container tests out)")
    if BASE.startswith("localhost/") and not found.image_exists(BASE):
        subprocess.run(["bash", str(ROOT / "images" / "base" / "build-base.sh"), BASE], check=True)
    return found


def _lock(repro: spec.Repro, variant: str, platform: str) -> Path:
    return lock_path(repro, variant, platform)


def _image_args() -> list[str]:
    args = ["--base", BASE]
    ca = os.environ.get("SSL_CERT_FILE")
    if ca and Path(ca).is_file():
        args += ["--ca-bundle", ca]  # TLS-intercepting proxies: pip inside the build needs it
    return args


def _containers(engine: images.Engine) -> list[str]:
    listed = subprocess.run([engine.name, "ps", "-a", "--format", "{{.Names}}"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    return [n for n in listed.stdout.split() if n.startswith("reprobox-")]


def _venv_then_image(
    repro: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, dict], dict[str, dict]]:
    """broken and fixed run in their venvs, then in their images: the newest records of each."""
    variants = ["--variant", "broken", "--variant", "fixed"]
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "venv"))
    venv = reprobox("run", repro, *variants, timeout=3600)
    assert venv.returncode == 0, venv.stderr
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "image"))
    boxed = reprobox("image", repro, *variants, "--run", *_image_args(), timeout=3600)
    assert boxed.returncode == 0, boxed.stderr
    return newest_records(tmp_path / "venv", repro), newest_records(tmp_path / "image", repro)


def test_lm_head_image_reaches_the_venv_verdicts(
    engine: images.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_venv, in_image = _venv_then_image("lm_head", tmp_path, monkeypatch)
    for variant in ("broken", "fixed"):
        assert in_image[variant]["verdict"] == in_venv[variant]["verdict"]
        assert in_image[variant]["metrics"]["lm_head_over_mean"] == pytest.approx(
            in_venv[variant]["metrics"]["lm_head_over_mean"], rel=1e-6
        )
        result = in_image[variant]["result"]
        assert result["versions"] == in_venv[variant]["result"]["versions"]
        assert result["world_size"] == 4
    assert in_image["broken"]["verdict"] == "reproduced"
    assert _containers(engine) == []


def test_a_container_past_its_timeout_is_killed_and_removed(
    engine: images.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path))
    done = reprobox("image", "lm_head", "--variant", "broken", "--run", "--timeout", "2",
                    *_image_args(), timeout=3600)  # fmt: skip
    assert done.returncode == ExitCode.TIMEOUT, done.stderr
    assert "killed and removed" in done.stderr.splitlines()[-1]
    assert _containers(engine) == []


@dataclass(frozen=True)
class _Tampered(images.ImageSpec):
    @property
    def lock_sha256(self) -> str:
        return "0" * 64


def test_a_lock_that_does_not_match_its_hash_never_builds(
    engine: images.Engine, tmp_path: Path
) -> None:
    repro = spec.load(ROOT, "lm_head")
    real = images.image_spec(ROOT, repro, "untied", "cpu", _lock(repro, "untied", "cpu"))
    tampered = _Tampered(real.repro, real.variant, real.platform, real.lock, real.dockerfile,
                         real.tag + "-tampered")  # fmt: skip
    ca = os.environ.get("SSL_CERT_FILE")
    with pytest.raises(EnvError, match="lock hash mismatch"):
        images.build(engine, tampered, base=BASE, log_dir=tmp_path,
                     ca_bundle=Path(ca) if ca and Path(ca).is_file() else None)  # fmt: skip
    assert not engine.image_exists(tampered.tag)


@pytest.mark.slow
def test_kl_image_reaches_the_venv_verdicts(
    engine: images.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real DeepSpeed ZeRO-2 run inside the kl CPU image (g++ and ninja in the image for
    DeepSpeed's op build) gives the venv's verdicts and the very same step-0 numbers."""
    in_venv, in_image = _venv_then_image("kl", tmp_path, monkeypatch)
    assert in_image["broken"]["verdict"] == "reproduced"
    assert in_image["fixed"]["verdict"] == "clean"
    for variant in ("broken", "fixed"):
        assert in_image[variant]["metrics"]["max_abs_logp_diff"] == pytest.approx(
            in_venv[variant]["metrics"]["max_abs_logp_diff"], abs=1e-6
        )
    assert _containers(engine) == []
