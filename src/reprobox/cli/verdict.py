"""`reprobox verdict`: one variant, answered in `git bisect run`'s exit codes.

git reads 0 as good, 125 as skip and every other code from 1 to 127 as bad, so a typo, a
read-only results folder or an unreachable Slurm that exited 2, 4 or 70 would be taken for
"this commit reproduces" and a first bad commit named. `bisect_code` is the one rule that
keeps that from happening: `verdict` exits 0, 1, 125, or 255 (git aborts), an interrupt
included (git aborts on 128 and above as well, but a caller other than git may not).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from reprobox.core.errors import ExitCode

STOP = 255  # `git bisect run`: abort, this is neither good, bad nor skip
COMMAND = "verdict"
_ANSWERS = (ExitCode.OK, ExitCode.FAILED, ExitCode.CANNOT_TEST)


def bisect_code(code: int | None) -> int:
    """The exit code `verdict` ends with for the harness's `code`: 0 clean, 1 reproduced,
    125 cannot test, an environment that cannot be installed (skip: git's convention for
    a commit that does not build) or a noisy verdict left undecided (neither good nor bad);
    anything else, an interrupt included, 255."""
    if code is None:
        return int(ExitCode.OK)
    if code in _ANSWERS:
        return int(code)
    if code in (ExitCode.ENV_FAILED, ExitCode.UNDECIDED):
        return int(ExitCode.CANNOT_TEST)
    return STOP


def is_verdict(argv: Sequence[str]) -> bool:
    """Whether the command line runs `verdict` (its first word that is not an option: the
    top-level parser has no option that takes a value), known before it is parsed, so an
    argparse error of `verdict` is mapped too."""
    return next((word for word in argv if not word.startswith("-")), None) == COMMAND


def register(
    commands: Any,
    cell_arguments: Callable[[argparse.ArgumentParser], None],
    backend_arguments: Callable[[argparse.ArgumentParser], None],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    """Add `verdict` to the command line, with the cell and back-end flags `run` has."""
    parser = commands.add_parser(
        COMMAND,
        help="run one variant; exit 0 clean / 1 reproduced / 125 cannot test / 255 anything "
        "else (git bisect run)",
        description="Run one variant and answer in `git bisect run`'s exit codes: 0 clean, "
        "1 reproduced, 125 cannot test (or an environment that cannot be installed: skip), "
        "255 for every other failure (bad input, the back end, the disk), which makes git "
        "abort instead of naming a commit.",
    )
    parser.add_argument("repro", help="the repro to run (see `reprobox list`)")
    cell_arguments(parser)
    backend_arguments(parser)
    parser.set_defaults(handler=handler)
