"""Post a report to an upstream issue with the GitHub CLI, or say exactly how to.

`gh issue comment N --repo OWNER/REPO --body-file FILE` does the posting, so authentication,
enterprise hosts and proxies are gh's business. Where gh is missing or not logged in, the
report is already on disk and the error names the command to run by hand.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from reprobox.core.errors import BadInput

_TARGET = re.compile(r"^(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(?P<number>[1-9][0-9]*)$")
GH_TIMEOUT_S = 120


class PostError(BadInput):
    """The report could not be posted; the message says what to run instead."""


@dataclass(frozen=True)
class Target:
    repo: str  # owner/name
    number: int

    def __str__(self) -> str:
        return f"{self.repo}#{self.number}"


def parse_target(text: str) -> Target:
    """`owner/repo#123` -> Target; anything else is bad input."""
    match = _TARGET.match(text.strip())
    if match is None:
        raise PostError(f"--post {text!r}: expected OWNER/REPO#NUMBER, e.g. pytorch/pytorch#123")
    return Target(match["repo"], int(match["number"]))


def gh_command(target: Target, body: Path) -> list[str]:
    return [
        "gh",
        "issue",
        "comment",
        str(target.number),
        "--repo",
        target.repo,
        "--body-file",
        str(body),
    ]


def post(target: Target, body: Path) -> str:
    """Post `body` as a comment on `target`; returns the comment URL gh prints."""
    command = gh_command(target, body)
    by_hand = shlex.join(command)
    gh = shutil.which("gh")
    if gh is None:
        raise PostError(f"gh (the GitHub CLI) is not installed; to post, run: {by_hand}")
    status = _run([gh, "auth", "status"])
    if status.returncode != 0:
        raise PostError(f"gh is not logged in (gh auth login, or GH_TOKEN); then run: {by_hand}")
    done = _run([gh, *command[1:]])
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        last = said[-1] if said else f"exit {done.returncode}"
        raise PostError(f"gh could not post to {target}: {last}; retry with: {by_hand}")
    return done.stdout.strip()


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=GH_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))
