"""The files a launch reads (run/sitehook.py notes them, run/reads.py reads the notes): what a
report's pasted comment must hold.

Real processes with the harness's `sitecustomize` on their PYTHONPATH, as the venv back end
starts ranks: a module picked by a runtime value is noted only when imported, a config only
when opened, and a process killed before it exits has noted what it read until then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from reprobox.run import reads, sitehook

SCRIPT = """\
import importlib, os, sys
import common
adapter = importlib.import_module({"old": "gen_old", "new": "gen_new"}[sys.argv[1]])
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[2])) as f:
    f.read()
if len(sys.argv) > 3:
    os.kill(os.getpid(), 9)
"""


def _repro(tmp_path: Path) -> tuple[Path, Path]:
    repro, fixes = tmp_path / "repros" / "toy", tmp_path / "fixes"
    repro.mkdir(parents=True)
    fixes.mkdir()
    (repro / "toy.py").write_text(SCRIPT)
    for name in ("common", "gen_old", "gen_new"):
        (repro / f"{name}.py").write_text("X = 1\n")
    (repro / "a.yaml").write_text("a: 1\n")
    (repro / "b.yaml").write_text("b: 1\n")
    return repro, fixes


def _launch(tmp_path: Path, repro: Path, fixes: Path, *args: str) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "REPRO"))},
        "PYTHONPATH": os.pathsep.join([str(fixes), str(sitehook.hook_dir(tmp_path / "cache"))]),
        **sitehook.launch_env(run_dir, [repro, fixes]),
    }
    return subprocess.run(
        [sys.executable, str(repro / "toy.py"), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_launch_notes_the_modules_it_imported_and_the_files_it_opened(tmp_path: Path) -> None:
    repro, fixes = _repro(tmp_path)
    done = _launch(tmp_path, repro, fixes, "old", "a.yaml")
    assert done.returncode == 0, done.stderr
    read = reads.files_read(tmp_path / "run", repro, fixes)
    assert read == ["a.yaml", "common.py", "gen_old.py", "toy.py"]  # not gen_new, not b.yaml
    done = _launch(tmp_path, repro, fixes, "new", "b.yaml")  # a second launch: the union
    assert done.returncode == 0, done.stderr
    read = reads.files_read(tmp_path / "run", repro, fixes)
    assert read == ["a.yaml", "b.yaml", "common.py", "gen_new.py", "gen_old.py", "toy.py"]


def test_a_process_that_never_exits_cleanly_has_noted_what_it_read(tmp_path: Path) -> None:
    """kl's ranks end with os._exit (no atexit) and a rank may be killed: every file is
    noted as it is opened, so the notes hold what was read before the end. Run twice, the
    second time from the bytecode caches the first wrote: still the sources' names."""
    repro, fixes = _repro(tmp_path)
    for _ in range(2):
        done = _launch(tmp_path, repro, fixes, "old", "a.yaml", "kill")
        assert done.returncode == -signal.SIGKILL
        read = reads.files_read(tmp_path / "run", repro, fixes)
        assert read == ["a.yaml", "common.py", "gen_old.py", "toy.py"]
    assert (repro / "__pycache__").is_dir()


def test_without_the_variables_the_hook_is_inert(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "REPRO"))}
    env["PYTHONPATH"] = str(sitehook.hook_dir(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", "import sys; print(len(sys.modules) > 0)"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


FORKER = """\
import os, sys, threading, time
import common
stop = threading.Event()
def busy():  # another thread opening the repro's files while the main thread forks
    while not stop.is_set():
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "a.yaml")) as f:
            f.read()
threading.Thread(target=busy, daemon=True).start()
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        import gen_old
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
stop.set()
"""


def test_a_child_forked_beside_a_busy_thread_notes_its_own_reads(tmp_path: Path) -> None:
    """torchrun's `--start_method fork` forks ranks from a process with threads: the hook
    holds no lock a fork could copy held (raw appends), and a forked child notes what it
    reads in a file of its own."""
    repro, fixes = _repro(tmp_path)
    (repro / "toy.py").write_text(FORKER)
    done = _launch(tmp_path, repro, fixes)
    assert done.returncode == 0, done.stderr
    assert reads.files_read(tmp_path / "run", repro, fixes) == [
        "a.yaml", "common.py", "gen_old.py", "toy.py"
    ]  # fmt: skip
    notes = list((tmp_path / "run" / reads.FOLDER).glob("*.txt"))
    assert len(notes) == 21  # the parent and its 20 children, one file each
