"""How each process of a launch ended, read from what the launchers leave behind.

The plain python launcher's ranks are the harness's own children, so their statuses are
known exactly. torchrun and `accelerate launch` (which runs torchrun's agent) exit 1 when
any worker fails and print each failed worker in a "Failures" block of their log:

    [1]:
      ...
      rank      : 1 (local_rank: 1)
      exitcode  : -11 (pid: 4242)

so those ranks' statuses are read from there. Workers the agent stopped itself once the
first one exited may be listed with -15 (SIGTERM); the judge knows that launchers do this.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from reprobox.core.protocol import RankExit

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_ERROR_LINE = re.compile(r"\b([A-Z]\w*(Error|Exception|Interrupt)\b.*)")


def launcher_exits(launcher_code: int | None, log: Path) -> tuple[RankExit, ...]:
    """The launcher's own status and every worker status its log reports."""
    if launcher_code is None:
        return ()
    return (RankExit(rank=None, code=launcher_code), *failed_workers(log))


def rank_exits(codes: Sequence[int | None]) -> tuple[RankExit, ...]:
    """Statuses of ranks the harness started itself, in rank order."""
    return tuple(RankExit(rank=i, code=c) for i, c in enumerate(codes) if c is not None)


def failed_workers(log: Path) -> list[RankExit]:
    """The ranks a torchrun "Failures" block names, with their exit codes."""
    found: dict[int, int] = {}
    rank: int | None = None
    for line in _lines(log):
        if match := _RANK.match(line):
            rank = int(match.group(1))
        elif (match := _EXITCODE.match(line)) and rank is not None:
            found.setdefault(rank, int(match.group(1)))
            rank = None
    return [RankExit(rank=r, code=c) for r, c in sorted(found.items())]


def last_error(logs: Iterable[Path]) -> str:
    """The last exception line any process printed, to make a crash's reason useful."""
    found = ""
    for log in logs:
        for line in _lines(log):
            match = _ERROR_LINE.search(line)
            if match and "ChildFailedError" not in line:
                found = match.group(1).strip()[:200]
    return found


def _lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []
