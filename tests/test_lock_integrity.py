"""A lock's header covers its body (issue 11, item 10): a lock edited with its header kept is
an integrity error (exit 6; `verdict` 255, so a bisect stops) wherever it would be used, and
`reprobox lock --check` says so, never "up to date"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core import spec
from reprobox.core.errors import BadInput, EnvError, ExitCode
from reprobox.core.settings import Settings
from reprobox.envs import locks
from reprobox.run import regenerate as regen
from reprobox.run.pipeline import lock_for, lock_path, lock_request

BODY = b"# python 3.11, platform cpu\ntorch==2.13.0 \\\n    --hash=sha256:aaaa\n"


def _signed(path: Path, input_hash: str, body: bytes = BODY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(locks.header_line(input_hash, body).encode() + b"\n" + body)
    return path


def _tamper(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"sha256:aaaa", b"sha256:bbbb"))


def _toy_locks(root: Path) -> list[Path]:
    repro = spec.load(root, "toy")
    return [
        _signed(lock_path(repro, v, "cpu"), lock_request(repro, v, "cpu").input_hash)
        for v in repro.variants_on("cpu")
    ]


def test_body_hash_covers_every_byte_below_the_first_line(tmp_path: Path) -> None:
    lock = _signed(tmp_path / "a.txt", "0123456789abcdef")
    assert locks.lock_input_hash(lock) == "0123456789abcdef"
    assert locks.body_problem(lock) is None
    locks.check_body(lock)

    _tamper(lock)  # a pin's hash swapped, the header kept
    with pytest.raises(EnvError, match="does not match the hash in its header") as caught:
        locks.check_body(lock, "repros/x/locks/a.cpu.txt")
    assert caught.value.exit_code == ExitCode.INTEGRITY
    assert str(caught.value).startswith("repros/x/locks/a.cpu.txt: ")

    lock.write_bytes(lock.read_bytes().replace(b"# python 3.11", b"# python 3.12"))
    assert locks.body_problem(lock) is not None  # a comment below the first line counts too

    lock.write_bytes(b"# reprobox-lock input=0123456789abcdef\n" + BODY)  # no body hash
    with pytest.raises(BadInput, match="no body hash"):
        locks.check_body(lock)


def test_committed_locks_carry_a_body_hash_that_matches(root: Path) -> None:
    committed = sorted(root.glob("repros/*/locks/*.txt"))
    assert committed
    assert {lock.name: locks.body_problem(lock) for lock in committed} == {
        lock.name: None for lock in committed
    }


def test_lock_for_refuses_a_committed_lock_edited_under_its_header(toy_root: Path) -> None:
    settings = Settings.from_env()
    repro = spec.load(toy_root, "toy")
    [clean, *_] = _toy_locks(toy_root)
    assert clean.name == "clean.cpu.txt"
    assert lock_for(repro, "clean", settings=settings) == clean
    _tamper(clean)
    with pytest.raises(EnvError) as caught:
        lock_for(repro, "clean", settings=settings)
    assert caught.value.exit_code == ExitCode.INTEGRITY
    assert "repros/toy/locks/clean.cpu.txt" in str(caught.value)


def test_a_cached_lock_edited_under_its_header_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = dataclasses.replace(Settings.from_env(), cache=tmp_path)
    request = locks.LockRequest(("six==1.16.0",), "3.11")
    cached = _signed(tmp_path / "locks" / f"{request.input_hash}.txt", request.input_hash)
    compiled: list[Path] = []
    monkeypatch.setattr(locks, "compile_lock", lambda r, dest, s: compiled.append(dest))
    assert locks.cached_lock(request, settings) == cached and not compiled
    _tamper(cached)
    with pytest.raises(EnvError) as caught:
        locks.cached_lock(request, settings)
    assert caught.value.exit_code == ExitCode.INTEGRITY and not compiled  # never re-resolved

    # One cached before locks carried a body hash is resolved again, not refused.
    cached.write_bytes(f"{locks.LOCK_HEADER}{request.input_hash}\n".encode() + BODY)
    with pytest.raises(BadInput):  # the fake resolver wrote nothing: what is there is checked
        locks.cached_lock(request, settings)
    assert compiled == [cached]


def test_regenerate_check_is_an_integrity_error_for_an_edited_lock(toy_root: Path) -> None:
    clean, other, *_ = _toy_locks(toy_root)
    settings = Settings.from_env()
    regen.regenerate(settings, ["toy"], check=False)  # the Dockerfile
    assert regen.regenerate(settings, ["toy"], check=True) == []
    other.write_bytes(b"# reprobox-lock input=0000\n")  # stale: named too
    _tamper(clean)
    tampered = r"clean\.cpu\.txt: the lock's body does not match"
    with pytest.raises(EnvError, match=tampered) as caught:
        regen.regenerate(settings, ["toy"], check=True)
    assert caught.value.exit_code == ExitCode.INTEGRITY
    assert f"also out of date: repros/toy/locks/{other.name} is stale" in str(caught.value)


def test_lock_check_and_run_and_verdict_through_the_cli(toy_root: Path) -> None:
    [clean, *_] = _toy_locks(toy_root)
    assert reprobox("lock").returncode == 0  # the Dockerfile; the locks are current
    assert reprobox("lock", "--check").returncode == 0
    _tamper(clean)

    done = reprobox("lock", "--check")
    assert done.returncode == ExitCode.INTEGRITY, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("reprobox: error: repros/toy/locks/clean.cpu.txt: the lock's body")

    done = reprobox("run", "toy", "--variant", "clean")
    assert done.returncode == ExitCode.INTEGRITY, done.stdout + done.stderr
    assert "does not match the hash in its header" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr

    done = reprobox("verdict", "toy", "--variant", "clean")
    assert done.returncode == 255, done.stdout + done.stderr  # stops a `git bisect run`
    assert "does not match the hash in its header" in done.stderr
