"""The torch source: what names one, what uv is given, what a record and an error say, the
pypi fallback flavour, and the CI path proved here: the local wheel folder served as an HTTP
simple index, pip's find-links off, a fresh uv cache, and a CPU cell run from its lock."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheel_index import WheelIndex

from conftest import newest_records, reprobox
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.settings import UV_SETTINGS, Settings
from reprobox.envs import locks, torch_source, venvs
from reprobox.envs.torch_source import TorchSource

SOURCE_SETTINGS = (
    "PIP_FIND_LINKS",
    "REPROBOX_FIND_LINKS",
    "REPROBOX_TORCH_INDEX",
    "REPROBOX_TORCH_SOURCE",
    *UV_SETTINGS,
)


@pytest.fixture
def local_wheels() -> tuple[str, ...]:
    """This machine's wheel folders (pip's find-links), where the CPU torch wheel lies.
    The CI-path tests need the CPU torch wheel to serve: without it they fail, not skip."""
    folders = torch_source.find_links(Settings.from_env())
    if not any(Path(f).glob("torch-*+cpu-*.whl") for f in folders):
        pytest.fail("no CPU torch wheel in pip's find-links folders to serve as an index")
    return folders


@pytest.fixture
def no_torch_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A machine with no torch source: pip's config and find-links off, a fresh uv cache and
    a fresh harness cache. Yields the uv cache folder."""
    for name in SOURCE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    uv_cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "reprobox-cache"))
    torch_source.pip_config.cache_clear()
    yield uv_cache
    torch_source.pip_config.cache_clear()


def test_describe_names_each_source_without_local_paths() -> None:
    assert TorchSource().describe() == "default index only"
    assert TorchSource(folders=("/a", "/b")).describe() == "find-links (2 local folders)"
    index = TorchSource(index="https://download.pytorch.org/whl/cpu")
    assert index.describe() == "index https://download.pytorch.org/whl/cpu"
    mixed = TorchSource(
        folders=("/a",),
        uv_settings=(("UV_FIND_LINKS", "/wheels"), ("UV_EXTRA_INDEX_URL", "https://x.test/s")),
    )
    assert mixed.describe() == (
        "find-links (1 local folder); UV_FIND_LINKS local; UV_EXTRA_INDEX_URL https://x.test/s"
    )
    assert "/a" not in mixed.describe() and "/wheels" not in mixed.describe()
    assert TorchSource(flavour="pypi", folders=("/a",)).describe().startswith("pypi")
    assert TorchSource().tried() == "default index only"
    assert index.tried().endswith("; the default index")


def test_uv_args_take_only_torch_from_the_index() -> None:
    """The index's torch page goes to uv as a flat link page, so every other package still
    comes from the default index (the committed locks' hashes are PyPI's)."""
    source = TorchSource(folders=("/w",), index="http://127.0.0.1:9/simple/")
    assert source.uv_args() == [
        "--find-links", "/w", "--find-links", "http://127.0.0.1:9/simple/torch/",
    ]  # fmt: skip
    assert TorchSource(flavour="pypi", folders=("/w",), index="http://x/simple").uv_args() == []


def test_settings_read_the_source(no_torch_source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _source() == TorchSource()
    monkeypatch.setenv("REPROBOX_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", "https://mirror.test/simple")
    assert _source().describe() == (
        "index https://download.pytorch.org/whl/cpu; UV_EXTRA_INDEX_URL https://mirror.test/simple"
    )
    monkeypatch.setenv("REPROBOX_TORCH_SOURCE", "pypi")
    assert _source().flavour == "pypi"
    monkeypatch.setenv("REPROBOX_TORCH_SOURCE", "host")
    assert _source().flavour == "host" and _source().uv_args() == []  # no torch from an index
    assert _source().describe() == "host (REPROBOX_HOST_PYTHON's own torch)"
    monkeypatch.setenv("REPROBOX_TORCH_SOURCE", "cuda")
    expected = "REPROBOX_TORCH_SOURCE='cuda': expected one of cpu, pypi, host"
    with pytest.raises(BadInput, match=expected):
        _source()


def _source() -> TorchSource:
    return torch_source.from_settings(Settings.from_env())


def test_pypi_flavour_is_its_own_lock_and_never_a_gpu_one() -> None:
    cpu = locks.LockRequest(("torch==2.13.0", "numpy<2"), "3.11")
    pypi = locks.for_torch_source(cpu, "pypi")
    assert pypi.torch_source == "pypi" and pypi.input_hash != cpu.input_hash
    assert locks.for_torch_source(pypi, "cpu").input_hash == cpu.input_hash
    gpu = locks.LockRequest(cpu.requirements, "3.11", platform="gpu")
    assert locks.for_torch_source(gpu, "pypi") is gpu
    assert locks._without_local("torch==2.13.0+cpu") == "torch==2.13.0"
    assert locks._without_local("numpy==1.26.4") == "numpy==1.26.4"


def test_pinned_torch_and_the_install_sources() -> None:
    cpu_lock = "torch==2.13.0+cpu \\\n    --hash=sha256:aa\n"
    gpu_lock = "torch==2.13.0 \\\n    --hash=sha256:bb\n"
    assert str(torch_source.pinned_torch(cpu_lock)) == "2.13.0+cpu"
    assert str(torch_source.pinned_torch(gpu_lock)) == "2.13.0"
    assert torch_source.pinned_torch("# torch==1\nnumpy==1.26.4\n") is None
    # The default index's build must not be shadowed by a same-numbered local CPU build.
    settings = Settings.from_env()
    assert venvs.torch_args(gpu_lock, settings) == []
    assert venvs.torch_args("six==1.16.0\n", settings) == []


@pytest.mark.e2e
def test_pypi_flavour_resolves_the_default_index_build(tmp_path: Path) -> None:
    request = locks.LockRequest(("torch==2.13.0",), "3.11", torch_source="pypi")
    text = locks.compile_lock(request, tmp_path / "pypi.txt", Settings.from_env()).read_text()
    assert str(torch_source.pinned_torch(text)) == "2.13.0"  # no +cpu: PyPI's own build
    assert "torch from the default index (REPROBOX_TORCH_SOURCE=pypi)" in text.splitlines()[1]


@pytest.mark.e2e
def test_no_cpu_torch_anywhere_is_one_line_with_the_sources_tried(
    toy_root: Path, no_torch_source: Path
) -> None:
    """Resolving: uv would quietly take the default index's CUDA build for a CPU lock."""
    done = reprobox("run", "toy", "--variant", "clean", timeout=600)
    assert done.returncode == ExitCode.ENV_FAILED, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("reprobox: error: "), line
    assert "cannot resolve: only the default index's torch==2.13.0 (the CUDA build)" in line
    assert "tried: default index only" in line and "REPROBOX_TORCH_INDEX=https://" in line
    assert "REPROBOX_TORCH_SOURCE=pypi" in line and "Traceback" not in done.stderr


@pytest.mark.e2e
def test_install_without_the_pinned_build_says_how_to_add_one(
    local_wheels: tuple[str, ...], no_torch_source: Path, tmp_path: Path
) -> None:
    """Installing: a committed CPU lock on a machine with no source of its torch."""
    wheel = next(w for f in local_wheels for w in Path(f).glob("torch-*+cpu-*.whl"))
    version = wheel.name.split("-")[1]
    lock = tmp_path / "lock.txt"
    lock.write_text(
        textwrap.dedent(f"""\
        torch=={version} \\
            --hash=sha256:{"0" * 64}
    """)
    )
    with pytest.raises(BadInput) as caught:
        venvs.ensure_env(lock, "3.11", settings=Settings.from_env())
    message = str(caught.value)
    assert f"cannot install: no such version: torch=={version}" in message
    assert "tried: default index only" in message and "REPROBOX_TORCH_INDEX=" in message
    assert "\n" not in message


@pytest.mark.e2e
def test_ci_path_torch_from_an_http_index(
    toy_root: Path, local_wheels: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """As a CI job: the lock was made where the wheel lies on disk; the job has no such folder,
    only an index serving the CPU build (here: the same wheel over HTTP on 127.0.0.1)."""
    made = reprobox("lock", "toy", timeout=600)  # with this machine's find-links, as committed
    assert made.returncode == 0, made.stderr
    committed = toy_root / "repros" / "toy" / "locks" / "clean.cpu.txt"
    assert "+cpu" in str(torch_source.pinned_torch(committed.read_text()))

    for name in SOURCE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    uv_cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "reprobox-cache"))
    with WheelIndex(local_wheels) as index:
        monkeypatch.setenv("REPROBOX_TORCH_INDEX", index.url)
        done = reprobox("run", "toy", "--variant", "clean", timeout=1200)
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert index.fetched("/simple/torch/"), index.requests
    torch_files = index.fetched("/files/torch-")
    assert torch_files and all("+cpu" in path for path in torch_files), index.requests
    # Only torch comes from the torch index; numpy and torch's own dependencies from the default.
    assert all(p.startswith(("/simple/torch/", "/files/torch-")) for p in index.requests)
    record = newest_records(toy_root / "results", "toy")["clean"]
    assert record["verdict"] == record["expect"] == "clean"
    assert Path(record["lock"]) == committed  # the committed lock, hash and all


def test_uv_settings_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_FIND_LINKS", "/somewhere/wheels")
    assert ("UV_FIND_LINKS", "/somewhere/wheels") in _source().uv_settings
    assert "UV_FIND_LINKS local" in _source().describe()
