"""The append-only log of a bisection, so an interrupted one resumes where it stopped.

The first line names the bisection (repro, package, range, ...); every probe appends one
line, flushed and fsynced before the next begins. Even after `kill -9` the log holds every
finished probe, and at worst a torn last line, which is cut off on load so the next probe's
line starts on a line of its own. A log that names another bisection, or holds a line that is
not a probe, is refused rather than mixed in. One bisect at a time holds a log: a second one
with the same arguments would run every probe twice.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from filelock import FileLock, Timeout
from pydantic import ValidationError

from reprobox.bisect.summary import ProbeEntry, first_problem
from reprobox.core.errors import BadInput

LOCK_WAIT_S = 3.0  # a second bisect of the same log waits this long, then says who holds it


class LogBusy(BadInput):
    """Another process holds this probe log."""


class ProbeLog:
    """A bisect's probe log, held exclusively from opening until `close()`."""

    def __init__(
        self, path: Path, header: dict[str, Any], *, lock_wait_s: float = LOCK_WAIT_S
    ) -> None:
        self.path = path
        self.header = header
        self.entries: dict[str, ProbeEntry] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(path) + ".lock", thread_local=False)
        self._owner = path.with_name(path.name + ".owner")
        try:
            self._lock.acquire(timeout=lock_wait_s)
        except Timeout:
            raise LogBusy(
                f"{path} is in use by another bisect ({self._holder()}); wait for it to "
                "finish, or pass another --log"
            ) from None
        try:
            self._owner.write_text(
                json.dumps({"pid": os.getpid(), "since": time.strftime("%H:%M:%S")}) + "\n"
            )
            if path.is_file() and path.stat().st_size > 0:
                self._load()
            else:
                self._append({"bisect": header})
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ProbeLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Let the next bisect of this log in."""
        if self._lock.is_locked:
            self._owner.unlink(missing_ok=True)
            self._lock.release()

    def _holder(self) -> str:
        try:
            owner = json.loads(self._owner.read_text())
            return f"pid {int(owner['pid'])}, since {owner.get('since', '?')}"
        except (OSError, ValueError, KeyError, TypeError):
            return "pid unknown"

    def _load(self) -> None:
        raw = self.path.read_bytes()
        if not raw.endswith(b"\n"):
            # kill -9 mid-write: keep what is whole, so the next line is not glued onto it
            whole = raw[: raw.rfind(b"\n") + 1]
            with self.path.open("r+b") as handle:
                handle.truncate(len(whole))
                handle.flush()
                os.fsync(handle.fileno())
            raw = whole
            if not raw:  # only a torn header: start the log afresh
                self._append({"bisect": self.header})
                return
        lines = raw.decode("utf-8", errors="replace").splitlines()
        try:
            first = json.loads(lines[0])["bisect"]
            if not isinstance(first, dict):
                raise TypeError
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
        for number, line in enumerate(lines[1:], start=2):
            entry = self._entry(line, number)
            self.entries[entry.key] = entry

    def _entry(self, line: str, number: int) -> ProbeEntry:
        where = f"{self.path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            raise BadInput(f"{where}: not JSON; delete that line to re-run its probe") from None
        if not isinstance(data, dict) or "key" not in data:
            shape = "no key" if isinstance(data, dict) else json.dumps(data)[:40]
            raise BadInput(f"{where}: not a probe entry ({shape}); delete that line")
        try:
            return ProbeEntry.model_validate(data)
        except ValidationError as exc:
            raise BadInput(
                f"{where}: not a probe entry ({first_problem(exc)}); delete that line"
            ) from None

    def get(self, key: str) -> ProbeEntry | None:
        return self.entries.get(key)

    def add(self, entry: ProbeEntry) -> None:
        self.entries[entry.key] = entry
        self._append_line(entry.log_line())

    def _append(self, data: dict[str, Any]) -> None:
        self._append_line(json.dumps(data, sort_keys=True))

    def _append_line(self, line: str) -> None:
        with self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
