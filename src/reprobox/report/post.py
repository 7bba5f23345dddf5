"""Post a report to an upstream issue with the GitHub CLI, or say exactly how to.

`gh issue comment N --repo OWNER/REPO --body-file FILE` does the posting, so authentication,
enterprise hosts and proxies are gh's business; `--edit-last` finds the previous comment of
this user carrying the report's hidden marker with `gh api` and replaces its body, so a
re-run updates one comment instead of adding another. Where gh is missing or not logged in, the
report is already on disk and the error names the command to run by hand.
"""

from __future__ import annotations

import json
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


def find_comment_command(target: Target, marker: str, login: str) -> list[str]:
    """`gh api` listing the issue's comments, printing the id of the newest one by `login`
    that carries `marker` (the report's hidden line)."""
    query = (
        f"[.[] | select(.user.login == {json.dumps(login)}) "
        f"| select(.body | contains({json.dumps(marker)}))] | last | .id // empty"
    )
    return [
        "gh", "api", "--paginate", f"repos/{target.repo}/issues/{target.number}/comments",
        "--jq", query,
    ]  # fmt: skip


def edit_command(target: Target, comment_id: str, body: Path) -> list[str]:
    return [
        "gh", "api", "--method", "PATCH", f"repos/{target.repo}/issues/comments/{comment_id}",
        "-F", f"body=@{body}", "--jq", ".html_url",
    ]  # fmt: skip


def dry_run(target: Target, body: Path, edit_last: bool = False) -> tuple[str, str]:
    """(the exact body that would be posted, one line saying how)."""
    how = shlex.join(gh_command(target, body))
    if edit_last:
        how = f"edit the last reprobox comment on {target} (gh api ... PATCH), else: {how}"
    return body.read_text(), f"dry run: would post {body.stat().st_size} bytes to {target}: {how}"


def post(target: Target, body: Path, edit_last: bool = False, marker: str = "") -> str:
    """Post `body` as a comment on `target` (or, with `edit_last`, replace the previous
    comment this user posted from this repro's report); returns the comment URL."""
    command = gh_command(target, body)
    by_hand = shlex.join(command)
    gh = shutil.which("gh")
    if gh is None:
        raise PostError(f"gh (the GitHub CLI) is not installed; to post, run: {by_hand}")
    status = _run([gh, "auth", "status"])
    if status.returncode != 0:
        raise PostError(f"gh is not logged in (gh auth login, or GH_TOKEN); then run: {by_hand}")
    if edit_last and marker:
        login = _run([gh, "api", "user", "--jq", ".login"])
        me = login.stdout.strip()
        if login.returncode != 0 or not me:
            raise PostError(f"gh could not say who is logged in; retry, or post with: {by_hand}")
        found = _run([gh, *find_comment_command(target, marker, me)[1:]])
        if found.returncode != 0:
            raise PostError(f"gh could not list the comments of {target}: {_last(found)}")
        ids = found.stdout.split()
        if ids:
            done = _run([gh, *edit_command(target, ids[-1], body)[1:]])
            if done.returncode != 0:
                raise PostError(f"gh could not edit comment {ids[-1]} on {target}: {_last(done)}")
            return done.stdout.strip()
    done = _run([gh, *command[1:]])
    if done.returncode != 0:
        raise PostError(f"gh could not post to {target}: {_last(done)}; retry with: {by_hand}")
    return done.stdout.strip()


def _last(done: subprocess.CompletedProcess[str]) -> str:
    said = (done.stderr or done.stdout).strip().splitlines()
    return said[-1] if said else f"exit {done.returncode}"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=GH_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


def gist_command(files: list[Path], description: str) -> list[str]:
    """`gh gist create` of the files a comment could not hold: secret (unlisted), so only
    readers of the comment find it."""
    return ["gh", "gist", "create", "--desc", description, *map(str, files)]


def publish_gist(files: list[Path], description: str) -> str:
    """Publish `files` as a secret gist (gh's default) and return its URL; gh must be
    installed and logged in (`post` checks both first)."""
    gh = shutil.which("gh")
    command = gist_command(files, description)
    if gh is None:
        raise PostError(
            f"gh (the GitHub CLI) is not installed; to publish, run: {shlex.join(command)}"
        )
    done = _run([gh, *command[1:]])
    url = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not url.startswith("https://"):
        raise PostError(
            f"gh could not create the gist of the files the comment leaves out: {_last(done)}"
        )
    return url
