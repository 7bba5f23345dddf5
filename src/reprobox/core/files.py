"""Writing a file so that a reader never sees half of it."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, text: str) -> Path:
    """Write `text` (plus a final newline) to a temporary sibling, fsync it, then rename it
    over `path`: a crash or a full disk leaves the old file or none, never a torn one."""
    if not text.endswith("\n"):
        text += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
