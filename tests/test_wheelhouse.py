"""Offline installs: `reprobox wheelhouse` fills a folder with what a lock installs, and with
REPROBOX_WHEELHOUSE a cell installs and runs from it with every index refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import newest_records, reprobox
from reprobox.cli import wheelhouse as wheelhouse_cli
from reprobox.core.errors import BadInput
from reprobox.core.settings import Settings
from reprobox.envs import wheelhouse

# A port nothing listens on: any index request fails at once.
REFUSED = "http://127.0.0.1:9/"


def test_lock_entries_keep_each_pin_with_its_hashes() -> None:
    text = (
        "# header\nnumpy==1.26.4 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
        "    # via toy\ntorch==2.13.0+cpu \\\n    --hash=sha256:cc\n"
    )
    entries = wheelhouse.lock_entries(text)
    assert [e.split(" ", 1)[0] for e in entries] == ["numpy==1.26.4", "torch==2.13.0+cpu"]
    assert "sha256:aa" in entries[0] and "sha256:bb" in entries[0] and "via" not in entries[0]


def test_several_locks_share_pins_and_the_host_torch_family_is_left_out(tmp_path: Path) -> None:
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    one.write_text(
        "numpy==1.26.4 \\\n    --hash=sha256:aa\ntorch==2.9.1 \\\n    --hash=sha256:bb\n"
        "nvidia-nccl-cu12==2.27.5 \\\n    --hash=sha256:cc\n"
        "triton==3.5.1 \\\n    --hash=sha256:dd\n"
        "nvidia-ml-py==13.580.82 \\\n    --hash=sha256:ee\n"
    )
    two.write_text("numpy==1.26.4 \\\n    --hash=sha256:aa\ncuda-toolkit==13.0.3.0\ntrl==0.7.2\n")
    kept, left_out = wheelhouse.wanted_entries([one, two], torch_from_host=True)
    assert [wheelhouse.entry_pin(e) for e in kept] == [
        "numpy==1.26.4", "nvidia-ml-py==13.580.82", "trl==0.7.2"
    ]  # fmt: skip
    assert left_out == ["torch==2.9.1", "nvidia-nccl-cu12==2.27.5", "triton==3.5.1",
                        "cuda-toolkit==13.0.3.0"]  # fmt: skip
    every, none = wheelhouse.wanted_entries([one, two], torch_from_host=False)
    assert len(every) == 7 and none == []


def test_targets_name_repros_and_their_variants() -> None:
    parsed = wheelhouse_cli.parse_targets(["kl:a,b", "lm_head"], [])
    assert parsed == [("kl", ["a", "b"]), ("lm_head", [])]
    assert wheelhouse_cli.parse_targets(["kl"], ["c"]) == [("kl", ["c"])]
    with pytest.raises(BadInput, match="exactly one repro"):
        wheelhouse_cli.parse_targets(["kl", "lm_head"], ["c"])


def test_pip_platforms_widen_manylinux_to_the_older_tags() -> None:
    tags = wheelhouse.pip_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and tags[-1] == "linux_x86_64"
    assert wheelhouse.pip_platforms("win_amd64") == ["win_amd64"]


def test_wheelhouse_setting_confines_installs(tmp_path: Path) -> None:
    base = {"REPROBOX_ROOT": str(tmp_path)}
    assert wheelhouse.install_args(Settings.from_env(base)) == []
    settings = Settings.from_env({**base, "REPROBOX_WHEELHOUSE": str(tmp_path)})
    assert wheelhouse.install_args(settings) == ["--no-index", "--find-links", str(tmp_path)]


@pytest.mark.e2e
def test_offline_install_and_run_from_a_wheelhouse(
    toy_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    house = tmp_path / "house"
    made = reprobox("wheelhouse", "toy", "--variant", "clean", "-o", str(house), timeout=600)
    assert made.returncode == 0, made.stderr
    names = sorted(p.name for p in house.iterdir())
    assert any(n.startswith("torch-") for n in names) and any(n.startswith("numpy-") for n in names)
    # Offline: a fresh harness cache holding only the lock, a fresh uv cache, every index refused.
    online_cache = Settings.from_env().cache
    offline = tmp_path / "offline-cache"
    (offline / "locks").mkdir(parents=True)
    for lock in (online_cache / "locks").glob("*.txt"):
        shutil.copy(lock, offline / "locks")
    for name in ("PIP_FIND_LINKS", "REPROBOX_FIND_LINKS", "UV_FIND_LINKS", "UV_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REPROBOX_CACHE", str(offline))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_INDEX_URL", REFUSED)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    refused = reprobox("run", "toy", "--variant", "clean", timeout=300)
    assert refused.returncode == 3, refused.stdout + refused.stderr  # no index: cannot install
    monkeypatch.setenv("REPROBOX_WHEELHOUSE", str(house))
    done = reprobox("run", "toy", "--variant", "clean", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    record = newest_records(toy_root / "results", "toy")["clean"]
    assert record["verdict"] == "clean" and record["status"] == "match"


@pytest.mark.e2e
def test_a_wheelhouse_for_a_host_with_its_own_torch_and_python(
    toy_root: Path, tmp_path: Path
) -> None:
    house = tmp_path / "house"
    made = reprobox("wheelhouse", "toy:clean", "--torch-from-host", "--python", "3.12",
                    "-o", str(house), timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stderr
    names = sorted(p.name for p in house.iterdir())
    assert not any(n.startswith("torch-") for n in names), names
    assert any(n.startswith("numpy-") and "cp312" in n for n in names), names
    said = made.stdout + made.stderr
    assert "left out, the host's torch gives them" in said
    assert "(hashes checked)" in said, said  # a uv lock hashes every Python's files


def test_a_bundle_carries_every_version_its_locks_pin() -> None:
    """kl's locks pin trl at 0.7.1 (broken) and 0.7.2 (fixed): both files are carried. A
    map by name kept only the last, and kl's broken environment then could not install
    offline (found by the nightly offline rebuild)."""
    from reprobox.cli.bundle import _pin, _pinned

    pins = {_pin("trl==0.7.1"), _pin("trl==0.7.2"), _pin("deepspeed==0.19.8")}
    assert _pinned("trl-0.7.1-py3-none-any.whl", pins)
    assert _pinned("trl-0.7.2-py3-none-any.whl", pins)
    assert _pinned("deepspeed-0.19.8.tar.gz", pins)
    assert not _pinned("trl-0.7.0-py3-none-any.whl", pins)
