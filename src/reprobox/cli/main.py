"""`reprobox` command line: parse arguments, call the layers below, turn errors into one line.

The modules below the CLI never print tracebacks at users and never call sys.exit; this is
the only place that maps a `ReproboxError` to its message and exit code. What users read in
`reprobox --help` is `_DESCRIPTION` and `_EPILOG`, not this docstring. This module only dispatches:
each command group lives in its own module (`cli.run`, `cli.bisect`, `cli.report`, ...),
adding its subcommands with `register(subparsers)` from the flags `cli.options` defines once;
`cli.ui` draws everything a person sees.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence
from dataclasses import replace

from reprobox.cli import options, ui
from reprobox.cli import verdict as verdict_cli
from reprobox.core import spec
from reprobox.core.errors import ExitCode, ReproboxError, interrupt_code
from reprobox.core.settings import Settings
from reprobox.run import interrupts


def program() -> int:
    """`reprobox` as a program (its console script, `python -m reprobox`): `main`, then an
    exit that skips the collector's last passes over every object the imports made
    (pydantic's schemas, rich's tables): about 25 ms of each run (docs/testing.md). The
    standard streams are still flushed and atexit handlers still run; only cyclic garbage
    is left unfinalized, as any exit may leave it. Not in `main`, which tests call in-process."""
    code = main()
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; `verdict` ends only in `git bisect run`'s codes (an argparse
    error or an uncaught exception included: `verdict_cli.bisect_code`)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if not verdict_cli.is_verdict(words):
        return _main(words)
    try:
        return verdict_cli.bisect_code(_main(words))
    except SystemExit as exc:  # argparse: bad flags (2), --help (0)
        return verdict_cli.bisect_code(exc.code if isinstance(exc.code, int) else 2)
    except KeyboardInterrupt:  # before or after the handled block
        return int(ExitCode.INTERRUPTED)
    except BaseException as exc:  # never a traceback that `git bisect run` reads as "bad"
        ui.error(f"internal error: {type(exc).__name__}: {exc} (please report it)")
        return verdict_cli.STOP


def _main(argv: Sequence[str]) -> int:
    parser = _parser(argv)
    args = parser.parse_args(argv)
    results = "results/"
    # SIGTERM (a cancelled CI job, timeout(1), nox) and SIGHUP (a closed terminal) end a
    # run as Ctrl-C does: ranks killed, the cell recorded as interrupted, one line, 143/129.
    with interrupts.handled():
        try:
            spec.check_overrides(getattr(args, "packages", None) or [], "--with")
            args.settings = Settings.from_env()  # read once, here, and passed down
            if getattr(args, "timeout", None):  # the host torch probe waits no longer
                args.settings = replace(args.settings, host_probe_timeout=args.timeout)
            ui.configure(args.settings)
            results = str(args.settings.results)
            return int(args.handler(args))
        except ReproboxError as exc:
            ui.error(str(exc))
            return int(exc.exit_code)
        except KeyboardInterrupt as exc:
            code = interrupt_code(exc)
            what = {
                ExitCode.TERMINATED: "terminated (SIGTERM)",
                ExitCode.HANGUP: "hung up (SIGHUP)",
            }.get(code, "interrupted")
            ui.error(f"{what}; results measured so far are kept under {results}")
            return int(code)
        except OSError as exc:  # a full or read-only results folder or cache, say
            where = f" ({exc.filename})" if exc.filename else ""
            ui.error(
                f"{exc.strerror or exc}{where}; results measured so far are kept under {results}"
            )
            return int(ExitCode.HARNESS_FAILED)
        except Exception as exc:  # never a traceback that `git bisect run` reads as "bad"
            ui.error(f"internal error: {type(exc).__name__}: {exc} (please report it)")
            return int(ExitCode.HARNESS_FAILED)


_DESCRIPTION = """\
Reproducible bug repros for the PyTorch / Hugging Face training stack. Each repro pins
its environment, runs a broken and a fixed variant (on several processes where the bug
needs them) and judges the measured result against what repro.toml expects.

Start here:
  reprobox list                  the repros; `reprobox list NAME` shows one in full
  reprobox run NAME              run a repro's default variants and print the verdicts

Every run is kept under results/<repro>/<cell>/<time>/ (record.json, the script's
result and the logs; REPROBOX_RESULTS moves them): `reprobox table` shows the newest
verdict of each cell, `reprobox report NAME` writes an upstream-ready report."""

_EPILOG = """\
exit status: 0 every verdict as expected, 1 a verdict differs, 2 bad input, 3 the
environment failed, 4 the run failed (a rank crashed or contradicts its result), 5 no
container engine, 6 a lock or image fails its hash, 8 a noisy cell undecided, 70 the
harness failed, 124 timeout, 129/130/143 hung up/interrupted/terminated; `verdict` answers
0 clean / 1 reproduced / 125 cannot test or undecided and 255 for anything else, as
`git bisect run` expects.
`reprobox COMMAND --help` describes each command."""


def _version() -> str:
    """The installed distribution's version (what a bug report should quote)."""
    from importlib import metadata  # only when asked: it costs every command otherwise

    try:
        return metadata.version("reprobox")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a distribution)"


class _VersionAction(argparse.Action):
    """--version, its version looked up only when asked (argparse's own action reads it for
    every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"reprobox {_version()}")
        parser.exit()


# Each command's module (`reprobox.cli.NAME`), in the order `--help` lists them. A command
# imports only its own module: `reprobox run` need not load the bisect, report or bundle code
# (each start of the CLI paid ~30 ms of CPU for them); --help, completion and a word that is
# no command load them all. tests/test_cli.py checks this table against what they register.
COMMANDS: dict[str, str] = {
    "list": "catalog", "lock": "catalog", "table": "catalog",
    "new": "new",
    "run": "run", "image": "run",
    "verdict": "verdict",
    "bisect": "bisect", "sweep": "bisect",
    "attribute": "attribute",
    "report": "report",
    "export": "export",
    "bundle": "bundle",
    "wheelhouse": "wheelhouse",
    "gpu-check": "gpu_check",
    "k8s": "scaleout", "collect": "scaleout", "newest": "scaleout", "ci-matrix": "scaleout",
    "canary-plan": "scaleout", "corpus": "scaleout",
    "completion": "complete",
}  # fmt: skip


def _parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line: each command group adds its subcommands from `cli.options`; only
    the group of the command in `argv` when it names one (else every group)."""
    parser: argparse.ArgumentParser = options.Parser(
        prog="reprobox",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of:"
    )
    word = next((w for w in argv if not w.startswith("-")), None)
    wanted = COMMANDS.get(word or "")
    if wanted == "complete":
        wanted = None  # completion describes every command
    for name in dict.fromkeys(COMMANDS.values()) if wanted is None else [wanted]:
        module = importlib.import_module(f"reprobox.cli.{name}")
        if name == "complete":
            module.register(commands, parser)
        else:
            module.register(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
