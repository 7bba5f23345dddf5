"""Exit codes and the errors that carry them.

Every way a run can end has one exit code and one plain sentence. The CLI turns a
`ReproboxError` into that sentence and code; nothing below it prints tracebacks at users.
"""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    """What the `reprobox` command returns.

    0/1/125 follow the `git bisect run` convention for the `verdict` command; the other codes
    name the failure so scripts and CI can tell them apart.
    """

    OK = 0  # every verdict matched its expectation (`verdict`: clean)
    FAILED = 1  # some verdict did not match (`verdict`: reproduced)
    BAD_INPUT = 2  # unknown repro, malformed repro.toml, bad version, bad flag
    ENV_FAILED = 3  # the environment could not be resolved or installed
    RUN_FAILED = 4  # a rank crashed, or the result is missing or malformed
    NO_ENGINE = 5  # no usable container engine
    INTEGRITY = 6  # a lock or image does not match its recorded hash (tampered or corrupt)
    # a noisy repro's repeated launches decided neither way within their budget (`verdict`:
    # 125, skip): never a guess
    UNDECIDED = 8
    HARNESS_FAILED = 70  # the harness itself failed (an unexpected error, a full disk)
    TIMEOUT = 124  # the launch outlived its timeout (as timeout(1) reports it)
    CANNOT_TEST = 125  # the variant cannot be tested here
    HANGUP = 129  # the terminal closed (128 + SIGHUP)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    TERMINATED = 143  # killed politely: a cancelled CI job, timeout(1), nox (128 + SIGTERM)


class ReproboxError(Exception):
    """A failure with a plain one-line message and a known exit code."""

    exit_code: ExitCode = ExitCode.RUN_FAILED

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class CannotTestHere(ReproboxError):
    """This host cannot run the cell (too few GPUs, say): a cannot-test result, judged as a
    script's own would be, not an error."""

    def __init__(self, message: str, by: str) -> None:
        super().__init__(message, exit_code=ExitCode.CANNOT_TEST)
        self.by = by  # who decided, written into the result


class BadInput(ReproboxError):
    """The user asked for something that does not exist or cannot be parsed."""

    exit_code = ExitCode.BAD_INPUT


class SpecError(BadInput):
    """A repro.toml is malformed; the message names the file and the field."""

    def __init__(self, file: object, field: str, problem: str) -> None:
        where = f"{file}: {field}" if field else f"{file}"
        super().__init__(f"{where}: {problem}")
        self.file = file
        self.field = field


class EnvError(ReproboxError):
    """Resolving or installing an environment failed."""

    exit_code = ExitCode.ENV_FAILED


class LaunchError(ReproboxError):
    """The launched processes did not produce a usable result."""

    exit_code = ExitCode.RUN_FAILED


class LaunchTimeout(LaunchError):
    exit_code = ExitCode.TIMEOUT


class EngineError(ReproboxError):
    """No container engine, or one that does not work."""

    exit_code = ExitCode.NO_ENGINE


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so every clean-up path that handles
    KeyboardInterrupt (records marked interrupted, ranks killed) runs for them too."""

    def __init__(self, signum: int) -> None:
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)
        self.exit_code: ExitCode = (
            ExitCode.HANGUP if self.signum == signal.SIGHUP else ExitCode.TERMINATED
        )


def interrupt_code(exc: BaseException) -> ExitCode:
    """The exit code an interrupt implies: 143 / 129 for a `Terminated`, else 130."""
    return exc.exit_code if isinstance(exc, Terminated) else ExitCode.INTERRUPTED
