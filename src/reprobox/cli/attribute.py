"""`attribute`: which package's change between two environments flips a variant's verdict,
and which release of it. `cli.main` adds it with `register(subparsers)`."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING

from reprobox.cli import bisect as bisect_cli
from reprobox.cli import cells, options
from reprobox.cli.progress import BisectProgress
from reprobox.core.errors import BadInput, ExitCode

if TYPE_CHECKING:
    from reprobox.bisect.prober import Target


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `attribute` to the `reprobox` parser."""
    parser = subparsers.add_parser(
        "attribute",
        help="name the package (and its release) whose change between two environments "
        "flips a variant's verdict",
        description="Compare two environments (each a lock, a `pip freeze` file, or a day "
        "YYYY-MM-DD: what uv resolves for the repro as of that day), check that their "
        "verdicts differ (ends that disagree are launched again before they are blamed), "
        "delta-debug the pins that differ to the package whose change flips the verdict "
        "(a set that cannot install is a skip), then bisect that package's releases with "
        "the other pins held at --from. One answer line, with what it assumed.",
    )
    parser.add_argument("repro", help="the repro to ask (see `reprobox list`)")
    parser.add_argument(
        "--from", dest="start", required=True, metavar="LOCK|FREEZE|DAY",
        help="the first environment: a lock, `pip freeze` output, or a day (YYYY-MM-DD, UTC)",
    )  # fmt: skip
    parser.add_argument(
        "--to", dest="end", required=True, metavar="LOCK|FREEZE|DAY",
        help="the second environment, as --from",
    )  # fmt: skip
    options.add(parser, "float")
    options.add(parser, "variant", "log", "platform", "timeout", "confirm")
    options.add(parser, *options.BACKEND, "json")
    parser.set_defaults(handler=cmd_attribute, packages=[], editables=[])


def cmd_attribute(args: argparse.Namespace) -> int:
    # start-up cost: the bisect modules load for this command only
    from reprobox.bisect import attribute

    target, defaults = bisect_cli._target(args)
    floats = args.float or ((defaults.float or [defaults.package]) if defaults else [])
    start = attribute.end_pins(args.start, "--from", target, floats)
    end = attribute.end_pins(args.end, "--to", target, floats)

    def next_step(package: str, last: str, first: str) -> str:
        return _commit_step(target, defaults, package, last, first)

    with BisectProgress(target.repro.name, verb="attributing") as progress:
        summary = attribute.attribute(
            target,
            start,
            end,
            labels=(args.start, args.end),
            index=cells.index(args),
            confirm=args.confirm,
            log_path=args.log,
            on_probe=progress.probe,
            next_step=next_step,
        )
    code = int(ExitCode.OK if summary.status in ("found", "ambiguous") else ExitCode.FAILED)
    bisect_cli._say(args, summary, code)
    return code


def _commit_step(target: Target, defaults: object, package: str, last: str, first: str) -> str:
    """How to go on to the commit, where the repro's [bisect] names this package or an
    installed copy names its repository (else nothing)."""
    from reprobox.bisect.commits import repo_from_metadata  # only for an answer

    repo = ""
    if getattr(defaults, "package", None) != package:
        try:
            repo = " --repo " + shlex.quote(repo_from_metadata(package, target.settings))
        except BadInput:
            return ""
    command = (
        f"reprobox bisect {target.repro.name} --commits --package {package} --variant "
        f"{target.variant} --good v{last} --bad v{first}{repo}"
    )
    return f"; on to the commit (tags as the repository spells them): `{command}`"
