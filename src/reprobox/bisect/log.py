"""The append-only log of a bisection, so an interrupted one resumes where it stopped.

The first line names the bisection (repro, package, range, ...); every probe appends one
line, flushed and fsynced before the next begins. Even after `kill -9` the log holds every
finished probe, and at worst a torn last line, which is ignored. A log that names another
bisection is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from reprobox.core.errors import BadInput


class ProbeLog:
    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.header = header
        self.entries: dict[str, dict[str, Any]] = {}
        if path.is_file() and path.stat().st_size > 0:
            self._load()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"bisect": header})

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            first = json.loads(lines[0])["bisect"]
        except (json.JSONDecodeError, KeyError, TypeError, IndexError):
            raise BadInput(f"{self.path} is not a reprobox bisect log") from None
        if first != self.header:
            differing = sorted(
                k for k in {*first, *self.header} if first.get(k) != self.header.get(k)
            )
            raise BadInput(
                f"{self.path} belongs to another bisect (differs in: {', '.join(differing)}); "
                "use another --log or the same arguments"
            )
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by kill -9: that probe simply runs again
            self.entries[entry["key"]] = entry

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def add(self, entry: dict[str, Any]) -> None:
        self.entries[entry["key"]] = entry
        self._append(entry)

    def _append(self, data: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(data, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
