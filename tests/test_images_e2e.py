"""Real image builds and runs with podman (or docker): the container reaches the venv path's
verdicts, a run past its timeout is killed and removed, and a tampered lock never builds.

Needs a container engine: .ci/run installs podman (images/setup-podman.sh) and builds the
local base image. Where no engine can be had, set REPROBOX_SKIP_CONTAINERS=1 to leave these
tests out knowingly; without it they fail rather than skip silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitrepo_fixture import PACKAGE, FlagRepo
from shared_runs import SharedRun

from conftest import FIXTURES, ROOT, newest_records, reprobox
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


def _containers(engine: images.Engine, settle_s: float = 15.0) -> list[str]:
    """The harness's containers still listed once the engine's own clean-up (a separate
    process for `--rm`) has had `settle_s` to finish: what is left then was left behind."""
    deadline = time.monotonic() + settle_s
    while True:
        listed = subprocess.run([engine.name, "ps", "-a", "--format", "{{.Names}}"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        names = [n for n in listed.stdout.split() if n.startswith("reprobox-")]
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


def _venv_then_image(
    repro: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    default_runs: Callable[[str], SharedRun],
) -> tuple[dict[str, dict], dict[str, dict]]:
    """broken and fixed in their venvs (the session's shared default run), then in their
    images: the newest records of each."""
    venv = default_runs(repro)
    assert venv.returncode == 0, venv.stderr
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "image"))
    variants = ["--variant", "broken", "--variant", "fixed"]
    boxed = reprobox("image", repro, *variants, "--run", *_image_args(), timeout=3600)
    assert boxed.returncode == 0, boxed.stderr
    return newest_records(venv.results, repro), newest_records(tmp_path / "image", repro)


def test_lm_head_image_reaches_the_venv_verdicts(
    engine: images.Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    default_runs: Callable[[str], SharedRun],
) -> None:
    in_venv, in_image = _venv_then_image("lm_head", tmp_path, monkeypatch, default_runs)
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
@pytest.mark.nightly  # see the nightly tier's table in docs/testing.md
def test_kl_image_reaches_the_venv_verdicts(
    engine: images.Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    default_runs: Callable[[str], SharedRun],
) -> None:
    """The real DeepSpeed ZeRO-2 run inside the kl CPU image (g++ and ninja in the image for
    DeepSpeed's op build) gives the venv's verdicts and the very same step-0 numbers."""
    in_venv, in_image = _venv_then_image("kl", tmp_path, monkeypatch, default_runs)
    assert in_image["broken"]["verdict"] == "reproduced"
    assert in_image["fixed"]["verdict"] == "clean"
    for variant in ("broken", "fixed"):
        assert in_image[variant]["metrics"]["max_abs_logp_diff"] == pytest.approx(
            in_venv[variant]["metrics"]["max_abs_logp_diff"], abs=1e-6
        )
    assert _containers(engine) == []


@pytest.fixture
def flag_image_root(scratch_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout holding the flagpkg fixture repro and its image recipe (one plain process,
    one tiny wheel: the lightest image there is)."""
    from reprobox.run.dockerfile import render

    shutil.copytree(FIXTURES / "repros" / "flagpkg", scratch_root / "repros" / "flagpkg")
    images_dir = scratch_root / "images"
    (images_dir / "flagpkg").mkdir(parents=True)
    shutil.copy(ROOT / "images" / "install-lock.sh", images_dir / "install-lock.sh")
    repro = spec.load(scratch_root, "flagpkg")
    (images_dir / "flagpkg" / "Dockerfile").write_text(render(repro))
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))
    return scratch_root


def _label(engine: images.Engine, tag: str, label: str) -> str:
    proc = subprocess.run(
        [engine.name, "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}',
         tag], capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def test_an_image_at_a_git_ref_holds_exactly_that_commit(
    engine: images.Engine, flag_image_root: Path, flagrepo: FlagRepo
) -> None:
    sha = flagrepo.shas["feature3"]  # refs/pull/15/head: BROKEN on
    source = f"{PACKAGE}@git+{flagrepo.url}@refs/pull/15/head"
    done = reprobox("image", "flagpkg", "--variant", "broken", "--run", "--with", source,
                    *_image_args(), timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stderr  # broken expects reproduced, and it is
    [record] = newest_records(flag_image_root / "results", "flagpkg").values()
    assert record["verdict"] == "reproduced" and record["commits"] == {PACKAGE: sha}
    assert record["runner"].startswith(engine.name)
    tag = record["runner"].split()[-1]
    assert _label(engine, tag, images.COMMITS_LABEL) == f"{PACKAGE}={sha}"
    # the image's lock names the wheel inside the build, never a path of this host
    lock = Path(record["lock"])
    image_lock = lock.with_name(lock.stem + ".image.txt").read_text()
    assert "file:///tmp/wheels/" in image_lock and str(flag_image_root.parent) not in image_lock
    assert _containers(engine) == []


def test_an_image_with_a_checkout_holds_it_as_it_is_now(
    engine: images.Engine, flag_image_root: Path, flagrepo: FlagRepo, tmp_path: Path
) -> None:
    checkout = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(flagrepo.path), str(checkout)], check=True)
    subprocess.run(["git", "checkout", "-q", flagrepo.shas["docs"]], cwd=checkout, check=True)
    (checkout / "flagpkg" / "_broken.py").write_text("BROKEN = True\n")  # not committed
    done = reprobox("image", "flagpkg", "--variant", "broken", "--run",
                    "--with-editable", f"{PACKAGE}={checkout}", *_image_args(),
                    timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [record] = newest_records(flag_image_root / "results", "flagpkg").values()
    state = record["commits"][PACKAGE]
    assert state.startswith(f"{flagrepo.shas['docs']}+dirty.")
    assert record["verdict"] == "reproduced"
    tag = record["runner"].split()[-1]
    assert _label(engine, tag, images.COMMITS_LABEL) == f"{PACKAGE}={state}"
    assert _containers(engine) == []
