"""Locks and environments: stable input hashes, uv errors in one line, and concurrent
creators of one environment that neither fail nor corrupt it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobox.core.settings import Settings
from reprobox.envs import locks, uv, venvs


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
