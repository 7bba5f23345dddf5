"""Writing a file so that a reader never sees half of it."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def atomic_write(path: Path, text: str) -> Path:
    """Write `text` (plus a final newline) to a temporary sibling, fsync it, then rename it
    over `path`: a crash or a full disk leaves the old file or none, never a torn one."""
    if not text.endswith("\n"):
        text += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    # one temporary per writer, threads included: two threads of one process writing the
    # same file at once (two bisect workers installing the read hook) shared a pid-named
    # temporary, and the second rename found it gone
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with tmp.open("w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
