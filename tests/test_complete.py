"""`reprobox completion bash|zsh` through the real CLI: bash accepts the script (`bash -n`), and
sourced into a real bash with COMP_WORDS set, it completes commands, flags, choices and the
repro names `reprobox list` finds (asked of `reprobox completion --repros` at each Tab)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core.errors import ExitCode

_COMPLETE = """\
source "$1"
shift
for line in "$@"; do
  read -ra COMP_WORDS <<< "$line"
  [[ "$line" == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  COMPREPLY=()
  _shtab_reprobox
  echo "${COMPREPLY[*]}"
done
"""


@pytest.fixture
def bash_script(toy_root: Path, tmp_path: Path) -> Path:
    done = reprobox("completion", "bash", timeout=120)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "reprobox.bash"
    path.write_text(done.stdout)
    return path


def _complete(script: Path, tmp_path: Path, *lines: str) -> list[str]:
    """What bash completes for each command line (a trailing space: a new word)."""
    bin_dir = tmp_path / "bin"  # `reprobox` on PATH, as an installed one is
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "reprobox").write_text(f'#!/bin/sh\nexec {sys.executable} -m reprobox "$@"\n')
    (bin_dir / "reprobox").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", _COMPLETE, "complete", str(script), *lines],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_bash_accepts_the_script(bash_script: Path) -> None:
    assert shutil.which("bash")
    checked = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_commands_flags_choices_and_repro_names_complete(bash_script: Path, tmp_path: Path) -> None:
    got = _complete(bash_script, tmp_path, "reprobox ru", "reprobox run ", "reprobox bisect t",
                    "reprobox run toy --work", "reprobox run toy --platform ",
                    "reprobox table ", "reprobox completion ")  # fmt: skip
    assert got == ["run", "toy", "toy", "--workers", "cpu gpu", "toy", "bash zsh"]
    variants = _complete(bash_script, tmp_path, "reprobox run toy --variant cl",
                         "reprobox bisect toy --variant ", "reprobox run --variant ")  # fmt: skip
    assert variants[0] == "clean"
    assert variants[1].split()[:3] == ["clean", "reproduced", "cannot"]
    assert variants[2] == ""  # no repro named yet: nothing to offer


def test_zsh_script_and_a_missing_shell(toy_root: Path) -> None:
    done = reprobox("completion", "zsh", timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("#compdef reprobox")
    assert "_reprobox_repros" in done.stdout
    if shutil.which("zsh"):
        assert subprocess.run(["zsh", "-n"], input=done.stdout, text=True).returncode == 0
    names = reprobox("completion", "--repros", timeout=120)
    assert names.stdout == "toy\n"
    bare = reprobox("completion", timeout=120)
    assert bare.returncode == ExitCode.BAD_INPUT and bare.stdout == ""
    assert bare.stderr == "reprobox: error: completion needs a shell: bash or zsh\n"
