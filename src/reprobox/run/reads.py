"""Which of a repro's files a launch read: what the report's pasted comment must hold.

A script may pick a module by the release it runs against (kl imports `gen_old` under trl
0.7, `gen_trainer` under 0.12+), so reading its imports tells what it could need, not what
the shown commands need. The venv back end puts a `sitecustomize` of the harness's own on
the launched processes' PYTHONPATH (after the fixes; it is no module of reprobox, and the
script never imports it): each process notes every file under the repro's folder or
`fixes/` it opens (an audit hook on `open`: configs, data, and the modules it imports, as
their source or their bytecode cache), line by line to its own file in the run folder, so
a rank that ends with `os._exit` (no atexit) or is killed has noted what it read so far.
An empty answer means "not known" (another back end, an older record), never "none".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from reprobox.core.files import atomic_write

LOG_ENV = "REPROBOX_READ_LOG"  # the folder each process writes the files it read to
ROOTS_ENV = "REPROBOX_READ_ROOTS"  # the folders whose files are noted (os.pathsep-separated)
FOLDER = "files-read"  # in the launch's run folder

HOOK = '''\
"""Written by reprobox: notes which files of the repro under test this process reads (the
repro's report shows exactly those). Inert unless REPROBOX_READ_LOG is set."""
import os as _os
import sys as _sys


def _reprobox_note_reads():
    out = _os.environ.get("REPROBOX_READ_LOG")
    roots = tuple(r for r in _os.environ.get("REPROBOX_READ_ROOTS", "").split(_os.pathsep) if r)
    if not out or not roots:
        return
    seen = set()
    log = []

    def hook(event, args):
        if event != "open" or not args or not isinstance(args[0], str):
            return
        path = args[0]
        if not path.startswith(roots) or path in seen:
            return
        seen.add(path)
        try:  # at once, line by line: a script may end with os._exit (no atexit)
            if not log:
                _os.makedirs(out, exist_ok=True)
                log.append(open(_os.path.join(out, "%d.txt" % _os.getpid()), "a"))
            log[0].write(path + "\\n")
            log[0].flush()
        except OSError:
            pass

    _sys.addaudithook(hook)


_reprobox_note_reads()
del _reprobox_note_reads
'''


def hook_dir(cache: Path) -> Path:
    """The folder holding the hook's `sitecustomize.py` (written once per content)."""
    folder = cache / "read-hook"
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
        LOG_ENV: str(run_dir / FOLDER),
        ROOTS_ENV: os.pathsep.join(str(root.absolute()) + os.sep for root in roots),
    }


def files_read(run_dir: Path, repro_dir: Path, fixes_dir: Path) -> list[str]:
    """The files the launch in `run_dir` read, named as a report shows them (`gen_old.py`,
    `fixes/x.py`); bytecode caches and locks left out. Empty when no process wrote."""
    folder = run_dir / FOLDER
    found: set[str] = set()
    try:
        notes = sorted(folder.glob("*.txt"))
    except OSError:
        return []
    for note in notes:
        try:
            lines = note.read_text().splitlines()
        except OSError:
            continue
        for line in filter(None, lines):
            shown = _shown(Path(line), repro_dir.absolute(), fixes_dir.absolute())
            if shown:
                found.add(shown)
    return sorted(found)


def _shown(path: Path, repro_dir: Path, fixes_dir: Path) -> str:
    if path.parent.name == "__pycache__":  # a module loaded from its bytecode cache
        path = path.parent.parent / (path.name.split(".", 1)[0] + ".py")
    for base, prefix in ((repro_dir, ""), (fixes_dir, "fixes/")):
        if path.is_relative_to(base):
            relative = path.relative_to(base)
            if relative.parts[0] == "locks":
                return ""
            return prefix + relative.as_posix()
    return ""
