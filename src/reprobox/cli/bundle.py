"""The `bundle` command: a folder and a .tar.gz that reproduce a repro with no reprobox.
`cli.main` adds it with `register(subparsers)`; the handler returns an exit code and raises
`ReproboxError` for failures, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from reprobox.cli import options, ui
from reprobox.core import spec
from reprobox.core.settings import Settings
from reprobox.envs import wheelhouse
from reprobox.run.pipeline import lock_for

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
    options.add(bundle, "platform", "wheelhouse")
    bundle.set_defaults(handler=cmd_bundle)


def cmd_bundle(args: argparse.Namespace) -> int:
    # start-up cost: the report modules load for a bundle only
    from reprobox.report.bundle import bundle_lock_name, default_out, write_bundle

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
    if args.wheelhouse:  # the bundle installs from this folder alone: it carries its files
        folder = args.wheelhouse.expanduser().absolute()
        made = _with_wheelhouse(repro, variants, locks, out, args.platform, names, settings, folder)
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
    folder: Path,
) -> Bundle:
    """The bundle carrying, from `folder` (filled first with what it lacks, hashes checked),
    every file its locks install and nothing else the folder holds."""
    # start-up cost: the report modules load for a bundle only
    from reprobox.report.bundle import write_bundle

    python = repro.python(platform)
    ui.info(f"bundle {repro.name}: filling {folder} with what the locks install")
    chosen = list(dict.fromkeys(locks.values()))
    house = wheelhouse.download(chosen, folder, python=python, lock_python=python,
                                tag=wheelhouse.DEFAULT_TAG, settings=settings)  # fmt: skip
    entries, _ = wheelhouse.wanted_entries(chosen, torch_from_host=False)
    # (name, version) pairs, not a dict by name: locks pin one package at several versions
    # (kl's broken trl 0.7.1, fixed 0.7.2), and each version's file is carried
    pins = {_pin(wheelhouse.entry_pin(entry)) for entry in entries}
    with tempfile.TemporaryDirectory(prefix="reprobox-bundle-wheels-") as scratch:
        carried = [name for name in house.files if _pinned(name, pins)]
        for name in carried:
            (Path(scratch) / name).symlink_to(folder / name)
        made = write_bundle(repro, variants, locks, out, platform, names,
                            wheelhouse=Path(scratch))  # fmt: skip
    size = sum((folder / name).stat().st_size for name in carried)
    ui.info(f"bundle: wheelhouse/ holds {len(carried)} files, {size / 2**20:.1f} MiB")
    return made


def _pin(pin: str) -> tuple[str, str]:
    name, _, version = pin.partition("==")
    return canonicalize_name(name.split("[")[0].strip()), version.split(";")[0].strip()


def _pinned(filename: str, pins: set[tuple[str, str]]) -> bool:
    """Whether a wheel or sdist in the folder is one a lock pins (name and version)."""
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return False
    return (name, str(version)) in pins
