"""core.files.atomic_write from many threads at once: each writer has its own temporary, so
no rename finds another writer's gone (two bisect workers writing the read hook on their first
launch failed that way), and the file is always one writer's whole text."""

from __future__ import annotations

import threading
from pathlib import Path

from reprobox.core.files import atomic_write


def test_threads_writing_one_file_at_once_never_collide(tmp_path: Path) -> None:
    target = tmp_path / "hook" / "sitecustomize.py"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait()
        try:
            for _ in range(200):
                atomic_write(target, f"writer {n}\n" * 100)
        except BaseException as exc:  # collected, and asserted empty below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    lines = target.read_text().splitlines()
    assert len(lines) == 100 and len(set(lines)) == 1  # one writer's whole text
    assert list(target.parent.glob(".*.tmp")) == []
