"""Locks and environments: stable input hashes, uv errors in one line, and concurrent
creators of one environment that neither fail nor corrupt it."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobox.core.settings import Settings
from reprobox.envs import intact, locks, uv, venvs


def test_input_hash_ignores_order_but_not_content() -> None:
    a = locks.LockRequest(("torch==2.13.0", "numpy<2"), "3.11")
    b = locks.LockRequest(("numpy<2", "torch==2.13.0"), "3.11")
    assert a.input_hash == b.input_hash
    assert a.input_hash != locks.LockRequest(("numpy<2",), "3.11").input_hash
    assert a.input_hash != locks.LockRequest(a.requirements, "3.10").input_hash
    dated = locks.LockRequest(
        a.requirements, "3.11", exclude_newer_packages=(("numpy", "2023-09-16"),)
    )
    assert dated.input_hash != a.input_hash


def test_uv_errors_become_one_line() -> None:
    stderr = textwrap.dedent("""\
        error: No solution found when resolving dependencies
          cause: Because there is no version of trl==0.7.99 and you require trl==0.7.99, we can
        conclude that your requirements are unsatisfiable.
    """)
    line = uv.summarize_uv_error(stderr)
    assert "\n" not in line
    assert line.startswith("No solution found when resolving dependencies; cause: Because")


@pytest.mark.e2e
def test_concurrent_creators_share_one_environment(tmp_path: Path) -> None:
    """Two processes (two bisects, say) ask for the same environment at once."""
    cache = tmp_path / "cache"
    settings = Settings.from_env()
    lock = locks.compile_lock(
        locks.LockRequest(("six==1.16.0",), "3.11"), tmp_path / "six.txt", settings
    )
    script = textwrap.dedent(f"""
        import os, sys
        os.environ["REPROBOX_CACHE"] = {str(cache)!r}
        from pathlib import Path
        from reprobox.core.settings import Settings
        from reprobox.envs import venvs
        env = venvs.ensure_env(Path({str(lock)!r}), "3.11", settings=Settings.from_env())
        print(env.path, env.created)
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({path for path, _ in outputs}) == 1  # one content-addressed environment
    assert [created for _, created in outputs].count("True") == 1  # built once, by one of them
    env = Path(outputs[0][0])
    done = subprocess.run([env / "bin" / "python", "-c", "import six; print(six.__version__)"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.stdout.strip() == "1.16.0"


def test_split_lock_moves_whole_entries() -> None:
    lock = textwrap.dedent("""\
        # reprobox-lock input=abc
        #   deepspeed==0.19.8
        deepspeed==0.19.8 \\
            --hash=sha256:aaa
            # via -r -
        Torch==2.13.0+cpu \\
            --hash=sha256:bbb
    """)
    first, late = venvs.split_lock(lock, ["DeepSpeed"])
    assert late == "deepspeed==0.19.8 \\\n    --hash=sha256:aaa\n    # via -r -\n"
    assert "Torch==2.13.0+cpu" in first and "deepspeed==" not in first.replace("#   deep", "")
    assert venvs.split_lock(lock, []) == (lock, "")


# ---- a ready environment is checked against its lock before it is reused (issue 11, item 9)


def _fake_env(root: Path, dists: dict[str, tuple[str, list[str]]]) -> Path:
    """A venv-shaped folder: each distribution's dist-info with a RECORD of its files."""
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name, (version, files) in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        record = [f"{name}-{version}.dist-info/RECORD,,", *(f"{f},sha256=x,1" for f in files)]
        (info / "RECORD").write_text("\n".join(record) + "\n")
        for relative in files:
            (site / relative).parent.mkdir(parents=True, exist_ok=True)
            (site / relative).write_text("")
    return site


LOCK_TEXT = textwrap.dedent("""\
    # reprobox-lock input=abc
    six==1.16.0 \\
        --hash=sha256:aaa
    torch==2.13.0+cpu \\
        --hash=sha256:bbb
        # via -r -
""")


def test_check_env_names_what_a_ready_environment_lost(tmp_path: Path) -> None:
    site = _fake_env(
        tmp_path, {"six": ("1.16.0", ["six.py"]), "torch": ("2.13.0+cpu", ["torch/__init__.py",
                   "torch/lib/libtorch.so", "../../../bin/torchrun"])},
    )  # fmt: skip
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "torchrun").write_text("")
    assert venvs.check_env(tmp_path, LOCK_TEXT) is None

    (site / "torch" / "lib" / "libtorch.so").unlink()
    assert venvs.check_env(tmp_path, LOCK_TEXT) == "torch lost torch/lib/libtorch.so"
    (site / "torch" / "lib" / "libtorch.so").write_text("")
    (tmp_path / "bin" / "torchrun").unlink()  # a script outside site-packages counts too
    assert venvs.check_env(tmp_path, LOCK_TEXT) == "torch lost ../../../bin/torchrun"
    (tmp_path / "bin" / "torchrun").write_text("")

    (site / "six-1.16.0.dist-info").rename(site / "six-1.17.0.dist-info")
    assert venvs.check_env(tmp_path, LOCK_TEXT) == "six 1.17.0 (the lock pins 1.16.0) installed"
    (site / "six-1.17.0.dist-info").rename(site / "six-1.16.0.dist-info")
    (site / "Extra_Pkg-1.0.dist-info").mkdir()  # installed by hand into the environment
    assert venvs.check_env(tmp_path, LOCK_TEXT) == "extra-pkg installed but not in the lock"
    shutil.rmtree(site / "Extra_Pkg-1.0.dist-info")
    shutil.rmtree(site / "six-1.16.0.dist-info")
    assert venvs.check_env(tmp_path, LOCK_TEXT) == "six not installed"


def test_check_env_reads_quoted_record_paths(tmp_path: Path) -> None:
    site = _fake_env(tmp_path, {"six": ("1.16.0", []), "torch": ("2.13.0+cpu", [])})
    record = site / "six-1.16.0.dist-info" / "RECORD"
    record.write_text(record.read_text() + '"odd,name.py",sha256=x,1\n')
    assert venvs.check_env(tmp_path, LOCK_TEXT) == "six lost odd,name.py"
    (site / "odd,name.py").write_text("")
    assert venvs.check_env(tmp_path, LOCK_TEXT) is None


def _ready_fake_env(root: Path) -> tuple[Path, Path]:
    """A fake venv marked ready for LOCK_TEXT: (its site-packages, its lock file)."""
    env = root / "env"
    site = _fake_env(
        env,
        {
            "six": ("1.16.0", ["six.py"]),
            "torch": (
                "2.13.0+cpu",
                ["torch/__init__.py", "torch/nn/modules/linear.py", "../../../bin/torchrun"],
            ),
        },
    )
    (env / "bin" / "torchrun").write_text("")
    (env / venvs.READY_MARKER).write_text(LOCK_TEXT)
    lock = root / "lock.txt"
    lock.write_text(LOCK_TEXT)
    return site, lock


def test_a_later_run_trusts_a_checked_environment_until_a_folder_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full check (a stat of every module) runs once; later processes compare folder
    ctimes, and a file lost anywhere the check looked sends them back to the full check."""
    site, lock = _ready_fake_env(tmp_path)
    env = tmp_path / "env"
    monkeypatch.setattr(intact, "RACY_NS", 0)  # the fake's folders are only just written
    assert venvs.ready_problem(env, lock) is None
    assert intact.note_path(env).is_file()
    full = []
    monkeypatch.setattr(venvs, "check_env", lambda *a, **k: full.append(a) or "checked")
    venvs._CHECKED.clear()  # another harness process
    assert venvs.ready_problem(env, lock) is None and not full  # trusted: no full check
    monkeypatch.undo()
    for lost in ("torch/nn/modules/linear.py", "../../../bin/torchrun"):
        (site / lost).unlink()
        venvs._CHECKED.clear()
        assert venvs.ready_problem(env, lock) == f"torch lost {Path(lost)}"
        (site / lost).write_text("")
    (site / "Extra-1.0.dist-info").mkdir()  # a distribution added by hand
    venvs._CHECKED.clear()
    assert venvs.ready_problem(env, lock) == "extra installed but not in the lock"


def test_a_changed_lock_or_marker_or_a_recent_change_is_checked_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, lock = _ready_fake_env(tmp_path)
    env = tmp_path / "env"
    assert venvs.ready_problem(env, lock) is None
    assert not intact.note_path(env).exists()  # its folders changed within the last second
    monkeypatch.setattr(intact, "RACY_NS", 0)
    venvs._CHECKED.clear()
    assert venvs.ready_problem(env, lock) is None and intact.note_path(env).is_file()
    stamp = (env / venvs.READY_MARKER).stat().st_mtime
    assert intact.unchanged(env, stamp, LOCK_TEXT)
    assert not intact.unchanged(env, stamp + 1, LOCK_TEXT)  # the environment was rebuilt
    assert not intact.unchanged(env, stamp, LOCK_TEXT + "# more\n")  # another lock
    intact.note_path(env).write_text("{not json")
    assert not intact.unchanged(env, stamp, LOCK_TEXT)
    shutil.rmtree(site / "torch" / "nn")  # a whole folder gone: its parent changed
    venvs._CHECKED.clear()
    assert venvs.ready_problem(env, lock) == "torch lost torch/nn/modules/linear.py"


@pytest.mark.e2e
def test_a_ready_environment_that_lost_a_file_is_rebuilt(tmp_path: Path) -> None:
    """Deleting a module from a ready venv used to give an ImportError on every run."""
    settings = dataclasses.replace(Settings.from_env(), cache=tmp_path / "cache")
    lock = locks.compile_lock(
        locks.LockRequest(("six==1.16.0",), "3.11"), tmp_path / "six.txt", settings
    )
    env = venvs.ensure_env(lock, "3.11", settings=settings)
    assert env.created and not env.repaired
    assert not venvs.ensure_env(lock, "3.11", settings=settings).created  # reused as it is
    site = venvs.site_packages(env.path)
    assert site is not None
    (site / "six.py").unlink()
    venvs._CHECKED.clear()  # another harness process: it has not checked this one yet

    again = venvs.ensure_env(lock, "3.11", settings=settings)
    assert again.path == env.path and again.created
    assert again.repaired == "six lost six.py"
    done = subprocess.run([again.bin("python"), "-c", "import six; print(six.__version__)"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.stdout.strip() == "1.16.0", done.stderr
