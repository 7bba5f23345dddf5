"""Which of a repro's files a launch read: what the report's pasted comment must hold.

A script may pick a module by the release it runs against (kl imports `gen_old` under trl
0.7, `gen_trainer` under 0.12+), so reading its imports tells what it could need, not what
the shown commands need. The venv back end's `sitecustomize` (`sitehook`) has each process
note every file under the repro's folder or `fixes/` it opens (configs, data, and the
modules it imports, as their source or their bytecode cache); this module reads the notes.
An empty answer means "not known" (another back end, an older record), never "none".
"""

from __future__ import annotations

from pathlib import Path

from reprobox.run import sitehook

FOLDER = sitehook.READS  # in the launch's run folder


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
