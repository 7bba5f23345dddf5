"""The `bundle` command: a folder and a .tar.gz that reproduce a repro with no reprobox.
`cli.main` adds it with `register(subparsers)`; the handler returns an exit code and raises
`ReproboxError` for failures, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from reprobox.cli import options, ui
from reprobox.core.settings import Settings

if TYPE_CHECKING:
    from reprobox.core.spec import Repro
    from reprobox.report.bundle import Bundle


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
    bundle.add_argument(
        "--wheelhouse", action="store_true",
        help="carry every wheel and sdist the locks install (wheelhouse/): run.sh then "
             "installs with no index, the same environment months later",
    )  # fmt: skip
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
    if args.wheelhouse:
        made = _with_wheelhouse(repro, variants, locks, out, args.platform, names, settings)
    else:
        made = write_bundle(repro, variants, locks, out, args.platform, names)
    ui.info(f"bundle: {made.dir} and {made.archive} ({', '.join(made.variants)})")
    if made.scrubbed:
        ui.info(f"bundle: secrets replaced with [REDACTED] in {', '.join(made.scrubbed)}")
    ui.info(f"run it: cd {made.dir} && ./run.sh all   (or ./run.sh {made.variants[0]})")
    return 0


def _with_wheelhouse(
    repro: Repro,
    variants: list[str],
    locks: dict[str, Path],
    out: Path,
    platform: str,
    names: dict[str, str],
    settings: Settings,
) -> Bundle:
    """The bundle with every file its locks install, downloaded (hashes checked) first."""
    from reprobox.envs import wheelhouse
    from reprobox.report.bundle import write_bundle

    python = repro.python(platform)
    with tempfile.TemporaryDirectory(prefix="reprobox-bundle-wheels-") as scratch:
        ui.info(f"bundle {repro.name}: downloading what the locks install (wheelhouse/)")
        house = wheelhouse.download(
            list(dict.fromkeys(locks.values())), Path(scratch), python=python,
            lock_python=python, tag=wheelhouse.DEFAULT_TAG, settings=settings,
        )  # fmt: skip
        if house.unchecked:
            ui.info(f"bundle: hashes NOT checked for {', '.join(house.unchecked)}")
        made = write_bundle(repro, variants, locks, out, platform, names,
                            wheelhouse=Path(scratch))  # fmt: skip
        ui.info(f"bundle: wheelhouse/ holds {len(house.files)} files, "
                f"{house.bytes / 2**20:.1f} MiB")  # fmt: skip
    return made
