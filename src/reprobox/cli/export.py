"""The `export` command: a scrubbed copy of the newest results, for CI to upload instead of
the raw results folder (whose rank logs may hold secrets). `cli.main` adds it with
`register(subparsers)`."""

from __future__ import annotations

import argparse
from pathlib import Path

from reprobox.cli import options, ui
from reprobox.core import spec


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `export` to the `reprobox` parser."""
    export = subparsers.add_parser(
        "export",
        help="copy the newest results, scrubbed of secrets, to a folder (what CI uploads)",
        description="Copy each cell's newest record with its logs and result, and the "
        "bisect logs, reports and image build logs, into OUT with every secret, token and "
        "home directory replaced (as reports are). Links are not followed; files that are "
        "neither text nor an image are left out and named. OUT keeps the results layout.",
    )
    export.add_argument("repros", nargs="*", metavar="REPRO", help="repros (default: all)")
    export.add_argument(
        "-o", "--out", type=Path, required=True, help="a new or empty folder to write into"
    )
    export.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    # start-up cost: the report modules load for an export only
    from reprobox.report.export import export

    settings = options.settings(args)
    names = args.repros or spec.discover(settings.root)
    for name in names:
        spec.load(settings.root, name)  # a misspelt name is bad input, not an empty export
    done = export(settings.results, names, args.out)
    for path, why in done.left_out:
        ui.info(f"export: left out {path}: {why}")
    ui.info(f"export: {done.out}: {done.runs} runs, {done.files} files, scrubbed")
    return 0
