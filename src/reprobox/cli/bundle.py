"""The `bundle` command: a folder and a .tar.gz that reproduce a repro with no reprobox.
`cli.main` adds it with `register(subparsers)`; the handler returns an exit code and raises
`ReproboxError` for failures, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reprobox.cli import options, ui


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bundle` to the `reprobox` parser."""
    bundle = subparsers.add_parser(
        "bundle",
        help="write a folder + .tar.gz that runs the repro with no reprobox (uv or pip)",
    )
    bundle.add_argument("repro", help="the repro to bundle")
    options.add(bundle, "variant")
    bundle.add_argument("-o", "--out", type=Path, help="folder (default: results/<repro>/_bundle)")
    options.add(bundle, "platform")
    bundle.set_defaults(handler=cmd_bundle)


def cmd_bundle(args: argparse.Namespace) -> int:
    from reprobox.core import spec
    from reprobox.report.bundle import bundle_lock_name, default_out, write_bundle
    from reprobox.run.pipeline import lock_for

    settings = options.settings(args)
    repro = spec.load(settings.root, args.repro)
    variants = list(dict.fromkeys(args.variant)) or repro.default_variants
    for variant in variants:
        repro.variant(variant)  # an unknown variant: one line naming the known ones
    repro.platform(args.platform)
    locks = {}
    for variant in variants:
        ui.info(f"bundle {repro.name}: the lock of {variant}")
        locks[variant] = lock_for(repro, variant, args.platform, settings=settings)
    names = {v: bundle_lock_name(settings.root, lock) for v, lock in locks.items()}
    out = args.out or default_out(settings.results, repro.name)
    made = write_bundle(repro, variants, locks, out, args.platform, names)
    ui.info(f"bundle: {made.dir} and {made.archive} ({', '.join(made.variants)})")
    if made.scrubbed:
        ui.info(f"bundle: secrets replaced with [REDACTED] in {', '.join(made.scrubbed)}")
    ui.info(f"run it: cd {made.dir} && ./run.sh all   (or ./run.sh {made.variants[0]})")
    return 0
