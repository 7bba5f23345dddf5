"""The one rule that turns an exit code into `git bisect run`'s answer.

git reads 0 as good, 125 as skip and every other code from 1 to 127 as bad, so a typo, a
read-only results folder or an environment that would not install, had they exited 2, 3 or 70,
would be taken for "this commit reproduces" and a first bad commit named. `reprobox verdict`
ends through this rule, and a bundle's `./run.sh verdict VARIANT` uses the same numbers
(`report.bundle_run`), so neither ever answers "bad" for anything but a reproduced verdict.
"""

from __future__ import annotations

from reprobox.core.errors import ExitCode

STOP = 255  # `git bisect run`: abort, this is neither good, bad nor skip
ANSWERS = (ExitCode.OK, ExitCode.FAILED, ExitCode.CANNOT_TEST)
SKIPS = (ExitCode.ENV_FAILED, ExitCode.UNDECIDED)


def bisect_code(code: int | None) -> int:
    """The answer for the harness's `code`: 0 clean, 1 reproduced, 125 cannot test, an
    environment that cannot be installed (skip: git's convention for a commit that does not
    build) or a noisy verdict left undecided (neither good nor bad); anything else, an
    interrupt included, 255."""
    if code is None:
        return int(ExitCode.OK)
    if code in ANSWERS:
        return int(code)
    if code in SKIPS:
        return int(ExitCode.CANNOT_TEST)
    return STOP
