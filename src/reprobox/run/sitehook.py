"""The harness's own `sitecustomize`, on the PYTHONPATH of every process a venv launch starts
(after `fixes/`; it is no module of reprobox, and the script never imports it). It does two
things, both inert unless the launch's variables are set:

- notes every file under the repro's folder or `fixes/` that the process opens (an audit
  hook on `open`), line by line to a file of its own, so a rank that ends with `os._exit`
  or is killed has noted what it read (`reads.files_read` reads the notes);
- registers `faulthandler` on STACK_SIGNAL, writing every thread's Python stack to
  `stacks/PID.txt` in the run folder: a launch that times out (a hung collective) is sent
  that signal before it is killed, so its logs show where each rank was stuck.

The hook takes no lock a fork could leave held (raw `os.write` with O_APPEND, one file per
pid, reopened in a forked child): a rank forked from a process with threads (torchrun's
`--start_method fork`, DataLoader workers) must never block in it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from reprobox.core.files import atomic_write
from reprobox.run.watchdog import send

READ_LOG_ENV = "REPROBOX_READ_LOG"  # the folder each process writes the files it read to
READ_ROOTS_ENV = "REPROBOX_READ_ROOTS"  # the folders whose files are noted (os.pathsep)
STACKS_ENV = "REPROBOX_STACKS"  # the folder of each process's stack dump
READS = "files-read"  # in the launch's run folder
STACKS = "stacks"  # in the launch's run folder
STACK_SIGNAL = signal.SIGUSR2
DUMP_WAIT_S = 1.0  # faulthandler writes from its C signal handler: at once, GIL or not

HOOK = f'''\
"""Written by reprobox: notes which files of the repro under test this process reads (the
repro's report shows exactly those), and dumps every thread's stack on SIGUSR2 (sent by the
harness to a launch that timed out, just before it is killed). Inert unless the variables
are set."""
import os as _os
import sys as _sys


def _reprobox_note_reads():
    out = _os.environ.get("{READ_LOG_ENV}")
    roots = tuple(r for r in _os.environ.get("{READ_ROOTS_ENV}", "").split(_os.pathsep) if r)
    if not out or not roots:
        return
    seen = set()
    fd = [-1, -1]  # the note file's descriptor, and the pid that opened it

    def hook(event, args):
        if event != "open" or not args or not isinstance(args[0], str):
            return
        path = args[0]
        if not path.startswith(roots) or path in seen:
            return
        seen.add(path)
        try:  # at once, line by line (a script may end with os._exit); no lock to inherit
            if fd[1] != _os.getpid():
                _os.makedirs(out, exist_ok=True)
                name = _os.path.join(out, "%d.txt" % _os.getpid())
                fd[0] = _os.open(name, _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND, 0o644)
                fd[1] = _os.getpid()
            _os.write(fd[0], (path + "\\n").encode("utf-8", "surrogateescape"))
        except OSError:
            pass

    _sys.addaudithook(hook)


def _reprobox_stacks_on_signal():
    out = _os.environ.get("{STACKS_ENV}")
    if not out:
        return
    import faulthandler
    import signal

    def register():
        try:
            _os.makedirs(out, exist_ok=True)
            name = _os.path.join(out, "%d.txt" % _os.getpid())
            # kept open for the process's life: faulthandler writes to its descriptor
            register.file = open(name, "w")
            faulthandler.register(signal.{STACK_SIGNAL.name}, file=register.file,
                                  all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            pass

    register()
    _os.register_at_fork(after_in_child=register)


_reprobox_note_reads()
_reprobox_stacks_on_signal()
del _reprobox_note_reads, _reprobox_stacks_on_signal
'''


def hook_dir(cache: Path) -> Path:
    """The folder holding the hook's `sitecustomize.py` (written once per content)."""
    folder = cache / "site-hook"
    path = folder / "sitecustomize.py"
    try:
        if path.read_text() == HOOK:
            return folder
    except OSError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(path, HOOK)
    return folder


def launch_env(run_dir: Path, roots: Sequence[Path]) -> dict[str, str]:
    """The variables that turn the hook on for one launch (PYTHONPATH's entry apart)."""
    return {
        READ_LOG_ENV: str(run_dir / READS),
        READ_ROOTS_ENV: os.pathsep.join(str(root.absolute()) + os.sep for root in roots),
        STACKS_ENV: str(run_dir / STACKS),
    }


def dump_stacks(run_dir: Path, pids: Mapping[int, float]) -> list[Path]:
    """Ask every process of a launch that registered for it (`pids`: pid -> start time, as
    the guard knows them; signalled by identity (`watchdog.send`), never a recycled pid) to
    write its Python stacks, wait for them, and drop the empty files; the dumps written.
    With no `pids`, only the empty files go (a launch that ended by itself)."""
    folder = run_dir / STACKS
    try:
        ready = {int(p.stem): p for p in folder.glob("*.txt") if p.stem.isdigit()}
    except OSError:
        return []
    asked = [pid for pid in ready if pid in pids and send(pid, pids[pid], STACK_SIGNAL)]
    if asked:
        time.sleep(DUMP_WAIT_S)
    written = []
    for _, path in sorted(ready.items()):
        try:
            if path.stat().st_size:
                written.append(path)
            else:
                path.unlink()
        except OSError:
            continue
    if not written:
        try:
            folder.rmdir()  # nothing dumped: no folder either
        except OSError:
            pass  # not empty (a process still starting wrote its file) or already gone
    return written
