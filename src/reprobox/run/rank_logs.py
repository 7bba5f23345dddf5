"""A launch's logs as they are kept: per-rank files, each bounded, none holding a secret.

A rank that prints without end (a loop, a 2 GiB dump) would fill the results folder and make
every reader of its log slow, so a log over LOG_HEAD_BYTES + LOG_TAIL_BYTES keeps its head and
its tail, with one line in between saying how much was cut. Logs are scrubbed of secrets
(the environment's secret values, secret-shaped tokens) as they are kept, since they are
exported and attached like records.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TextIO

from reprobox.core.protocol import MAX_RESULT_BYTES, size_text
from reprobox.core.scrub import secrets_out
from reprobox.run import phases
from reprobox.run.backend import RESULT_FILE

LOG_HEAD_BYTES = 4 * 1024 * 1024  # what a capped log keeps of its start (the setup, the error)
LOG_TAIL_BYTES = 4 * 1024 * 1024  # and of its end (the last steps, the traceback)
_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:")
_COPY_CHUNK = 1024 * 1024
_MARKER_ROOM = 1024


def collect_rank_logs(log_dir: Path) -> list[Path]:
    """Per-rank logs as rank<N>.log in the launch's log dir, whatever the launcher wrote:
    torchrun's --log_dir tree, else the "[default<N>]:" prefixes --tee puts in launch.log.
    Every log there is then bounded and scrubbed (`bound_logs`)."""
    tree = log_dir / "torchrun"
    if tree.is_dir():
        for rank_dir in sorted(tree.glob("*/attempt_*/*")):
            if rank_dir.is_dir() and rank_dir.name.isdigit():
                with (log_dir / f"rank{rank_dir.name}.log").open("wb") as out:
                    for stream in ("stdout.log", "stderr.log"):
                        if (rank_dir / stream).is_file():
                            with (rank_dir / stream).open("rb") as source:
                                shutil.copyfileobj(source, out, _COPY_CHUNK)
        shutil.rmtree(tree, ignore_errors=True)
    elif not list(log_dir.glob("rank*.log")) and (log_dir / "launch.log").is_file():
        _split_by_prefix(log_dir / "launch.log", log_dir)
    bound_logs(log_dir)
    return sorted(log_dir.glob("rank*.log"))


def _split_by_prefix(launch_log: Path, log_dir: Path) -> None:
    """rank<N>.log from the prefixed lines of launch.log, read a line at a time."""
    sinks: dict[str, TextIO] = {}
    try:
        with launch_log.open("rb") as source:
            for raw in source:
                line = raw.decode(errors="replace")
                if match := _RANK_PREFIX.match(line):
                    rank = match.group(1)
                    if rank not in sinks:
                        sinks[rank] = (log_dir / f"rank{rank}.log").open("w")
                    sinks[rank].write(line[match.end() :].rstrip("\r\n") + "\n")
    finally:
        for sink in sinks.values():
            sink.close()


def bound_logs(log_dir: Path) -> list[Path]:
    """Cap and scrub every log directly in `log_dir` (idempotent), and scrub the result the
    script wrote there (one within the limit: a bigger one is never read); the logs, sorted."""
    logs = sorted(p for p in log_dir.glob("*.log") if p.is_file() and not p.is_symlink())
    for log in logs:
        cap_log(log)
    if logs:  # its own phase: scrubbing a capped log takes about a second per 8 MiB
        size = sum(log.stat().st_size for log in logs)
        phases.emit(
            phases.PhaseKind.SCRUBBING,
            f"{len(logs)} log{'s' * (len(logs) != 1)} ({size_text(size)})",
        )
    for log in logs:
        _scrub_log(log)
    result = log_dir / RESULT_FILE
    if result.is_file() and not result.is_symlink() and result.stat().st_size <= MAX_RESULT_BYTES:
        _scrub_result(result)
    return logs


def cap_log(path: Path, head: int = LOG_HEAD_BYTES, tail: int = LOG_TAIL_BYTES) -> bool:
    """Keep the first `head` and last `tail` bytes of a log over head + tail (cut at line
    ends), with a line saying what was cut; whether it was cut."""
    size = path.stat().st_size
    if size <= head + tail + _MARKER_ROOM:  # a capped log (head, tail, the line) stays as it is
        return False
    tmp = path.with_name(f".{path.name}.capped")
    with path.open("rb") as source, tmp.open("wb") as out:
        first = source.read(head)
        if b"\n" in first[head // 2 :]:
            first = first[: first.rindex(b"\n") + 1]
        source.seek(size - tail)
        last = source.read(tail)
        if b"\n" in last[: tail // 2]:
            last = last[last.index(b"\n") + 1 :]
        cut = size - len(first) - len(last)
        out.write(first if first.endswith(b"\n") else first + b"\n")
        out.write(
            f"[reprobox: {size_text(cut)} of this log cut here; it held {size_text(size)}, "
            f"of which its first {size_text(len(first))} and last {size_text(len(last))} "
            "are kept]\n".encode()
        )
        out.write(last)
    os.replace(tmp, path)
    return True


def _scrub_log(path: Path) -> None:
    """The log without secrets; rewritten only when it held one (bytes kept otherwise)."""
    text = path.read_bytes().decode(errors="replace")
    clean = secrets_out(text)
    if clean != text:
        path.write_text(clean)


def _scrub_result(path: Path) -> None:
    """The result without secrets, value by value (so it stays the JSON it was); one that is
    not JSON is left as it is, for the judge to refuse."""
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError):
        return
    clean = secrets_out(data)
    if clean != data:
        path.write_text(json.dumps(clean))
