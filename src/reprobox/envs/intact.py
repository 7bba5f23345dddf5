"""A ready venv's files, checked once and trusted by later runs until a folder holding them
changes.

`venvs.check_env` stats every module the RECORDs list: about 40 ms of every `reprobox run`
in a torch environment, before its launch. Removing, adding or renaming a file changes its
folder's ctime, which (unlike mtime) nothing can set back; so a later process that finds
every such folder's ctime as a passing check found it (taken before that check stat'ed the
folder's files), with the same lock and ready marker, knows the check would pass again, for
a stat per folder (about 950 in lm_head's environment). A folder changed within `RACY_NS` of
the check is not remembered: a change in the same clock tick could keep its ctime (git's
"racily clean" index entries).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

NOTE_SUFFIX = ".intact.json"  # beside the venv, not in it: writing it changes no folder inside
RACY_NS = 1_000_000_000


def note_path(env: Path) -> Path:
    return env.with_name(env.name + NOTE_SUFFIX)


def ctime_ns(folder: str) -> int:
    """A folder's ctime, or -1 when it cannot be read (gone: never equal to a recorded one)."""
    try:
        return os.stat(folder).st_ctime_ns
    except OSError:
        return -1


def unchanged(env: Path, stamp: float, lock_text: str) -> bool:
    """Whether the files of `env` are as a passing check of `lock_text` left them, with its
    ready marker's time `stamp`: every folder it recorded has the same ctime."""
    try:
        note = json.loads(note_path(env).read_text())
        if note["stamp"] != stamp or note["lock"] != _digest(lock_text):
            return False
        return all(ctime_ns(str(env / folder)) == ctime for folder, ctime in note["folders"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def remember(env: Path, stamp: float, lock_text: str, folders: dict[str, int]) -> bool:
    """Record a passing check: `folders` (relative to `env`) with the ctimes it found before
    stat'ing their files. Nothing is recorded when one changed too recently to trust."""
    if any(c < 0 for c in folders.values()):
        return False
    if max(folders.values(), default=0) > time.time_ns() - RACY_NS:
        note_path(env).unlink(missing_ok=True)
        return False
    note = {"stamp": stamp, "lock": _digest(lock_text), "folders": sorted(folders.items())}
    path = note_path(env)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(json.dumps(note))
        os.replace(partial, path)  # a reader sees the old note or the whole new one
    except OSError:
        partial.unlink(missing_ok=True)
        return False
    return True


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
