"""`list`, `table` and `lock`: what the repros are, what was measured of them, and the files
repro.toml determines. `cli.main` adds them with `register(subparsers)`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reprobox.cli import cells, options, ui
from reprobox.cli import listing as list_cli
from reprobox.core import spec
from reprobox.core.errors import BadInput


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `list`, `lock` and `table` to the `reprobox` parser."""
    listing = subparsers.add_parser(
        "list",
        help="repros, their variants and matrix cells (NAME: one repro in full)",
        description="Without NAME: every repro with its variants. With NAME: one repro in "
        "full: variants, verdict rule, launch, bisect defaults and every cell with the "
        "`reprobox run` arguments that select it.",
    )
    listing.add_argument("name", nargs="?", metavar="NAME", help="one repro to show in full")
    options.add(listing, "json")
    listing.set_defaults(handler=cmd_list)

    lock = subparsers.add_parser(
        "lock", help="regenerate (or --check) the committed locks and Dockerfiles"
    )
    lock.add_argument("repros", nargs="*", metavar="REPRO", help="only these (default: all)")
    lock.add_argument(
        "--check", action="store_true", help="write nothing; fail if a lock is stale or missing"
    )
    lock.set_defaults(handler=cmd_lock)

    table = subparsers.add_parser("table", help="the newest measured verdict of every cell on disk")
    table.add_argument("repros", nargs="*", metavar="REPRO", help="only these (default: all)")
    table.add_argument("--default", action="store_true", help="only the default cells")
    options.add(table, "format", "json")
    table.set_defaults(handler=cmd_table)


def cmd_list(args: argparse.Namespace) -> int:
    root = options.settings(args).root
    if args.name is not None:
        detail = list_cli.detail(spec.load(root, args.name), cells.index_axes(args))
        if args.json:
            print(json.dumps(detail, indent=2))
        else:
            ui.repro_detail(detail)
        return 0
    rows = [list_cli.row(spec.load(root, name)) for name in spec.discover(root)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        ui.repro_list(rows)
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    """Regenerate what repro.toml determines: the hashed locks and the image's Dockerfile."""
    # start-up cost: lock regeneration loads for `reprobox lock` only
    from reprobox.run.regenerate import regenerate

    settings = options.settings(args)
    root = settings.root
    names = args.repros or spec.discover(root)

    def written(path: Path) -> None:
        ui.info(f"{path.relative_to(root)}: written")

    problems = regenerate(settings, names, check=args.check, on_written=written)
    if problems:
        raise BadInput(f"out of date with repro.toml: {'; '.join(problems)}; run `nox -s lock`")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from reprobox.cli import table as table_cli  # start-up cost: `reprobox table` only

    return table_cli.show(options.settings(args), args.repros, args.default, args.format,
                          as_json=args.json)  # fmt: skip
