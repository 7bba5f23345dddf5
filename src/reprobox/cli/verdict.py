"""`reprobox verdict`: one variant, answered in `git bisect run`'s exit codes.

git reads 0 as good, 125 as skip and every other code from 1 to 127 as bad, so a typo, a
read-only results folder or an unreachable Slurm that exited 2, 4 or 70 would be taken for
"this commit reproduces" and a first bad commit named. `bisect_code` (`core.bisect_codes`,
which a bundle's `./run.sh verdict` shares) is the one rule that keeps that from happening:
`verdict` exits 0, 1, 125, or 255 (git aborts), an interrupt included (git aborts on 128 and
above as well, but a caller other than git may not).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from reprobox.cli import cells, options, ui
from reprobox.core import spec
from reprobox.core.bisect_codes import STOP as STOP  # re-exported: `cli.main` ends with it
from reprobox.core.bisect_codes import bisect_code as bisect_code  # and this
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import RecordStore
from reprobox.run import pipeline

COMMAND = "verdict"


def is_verdict(argv: Sequence[str]) -> bool:
    """Whether the command line runs `verdict` (its first word that is not an option: the
    top-level parser has no option that takes a value), known before it is parsed, so an
    argparse error of `verdict` is mapped too."""
    return next((word for word in argv if not word.startswith("-")), None) == COMMAND


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `verdict` to the command line, with the cell and back-end flags `run` has."""
    parser = subparsers.add_parser(
        COMMAND,
        help="run one variant; exit 0 clean / 1 reproduced / 125 cannot test / 255 anything "
        "else (git bisect run)",
        description="Run one variant and answer in `git bisect run`'s exit codes: 0 clean, "
        "1 reproduced, 125 cannot test (or an environment that cannot be installed: skip), "
        "255 for every other failure (bad input, the back end, the disk), which makes git "
        "abort instead of naming a commit.",
    )
    parser.add_argument("repro", help="the repro to run (see `reprobox list`)")
    options.add(parser, *options.CELL, *options.BACKEND)
    parser.set_defaults(handler=cmd_verdict)


def cmd_verdict(args: argparse.Namespace) -> int:
    """One variant, `git bisect run` exit codes: 0 clean, 1 reproduced, 125 cannot test (or
    an environment that cannot be resolved or installed); anything else is 255, which stops
    a `git bisect run`, so a harness failure is never read as "bad"."""
    settings = options.settings(args)
    repro = spec.load(settings.root, args.repro)
    selected = cells.selected(repro, args)
    if len(selected) != 1:
        raise BadInput("verdict takes exactly one --variant")
    store = RecordStore(settings.results)
    backend = cells.backend(args)
    [record] = pipeline.run_cells(
        repro, selected, backend, store, settings, cells.run_options(args)
    )
    ui.record_line(record)
    cells.say_commits([record])
    if record.verdict is not None and record.status != Status.ERROR:
        return Verdict(record.verdict).exit_code
    if record.exit_code not in (ExitCode.ENV_FAILED, ExitCode.CANNOT_TEST):  # skips
        ui.error(record.reason)
    return bisect_code(record.exit_code)
