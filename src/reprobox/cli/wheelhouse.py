"""The `wheelhouse` command: every wheel and sdist a variant's lock installs, in one folder, so
a node with no internet installs it (`REPROBOX_WHEELHOUSE=DIR`). `cli.main` adds it with
`register(subparsers)`; failures raise `ReproboxError`, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reprobox.cli import ui


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `wheelhouse` to the `reprobox` parser."""
    parser = subparsers.add_parser(
        "wheelhouse",
        help="download every wheel/sdist a lock needs into a folder, for offline installs",
    )
    parser.add_argument("repro", help="the repro whose lock to download")
    parser.add_argument(
        "--variant", action="append", default=[], metavar="V",
        help="a variant (repeatable; default: the default variants on the platform)",
    )  # fmt: skip
    parser.add_argument("--platform", default="cpu", help="whose locks (default: cpu)")
    parser.add_argument(
        "--python", metavar="X.Y", help="the target's Python (default: the lock's own)"
    )
    parser.add_argument(
        "--tag", metavar="TAG", help="the target's platform tag (default: manylinux_2_28_x86_64)"
    )
    parser.add_argument("-o", "--out", type=Path, required=True, help="the folder to fill")
    parser.set_defaults(handler=cmd_wheelhouse)


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    from reprobox.core import spec
    from reprobox.core.settings import Settings
    from reprobox.envs import wheelhouse
    from reprobox.run.pipeline import lock_for

    settings = getattr(args, "settings", None) or Settings.from_env()
    repro = spec.load(settings.root, args.repro)
    repro.platform(args.platform)
    variants = list(dict.fromkeys(args.variant)) or [
        v for v in repro.variants_on(args.platform) if repro.variant(v).default
    ]
    lock_python = repro.python(args.platform)
    python = args.python or lock_python
    total = None
    for variant in variants:
        repro.variant(variant)  # an unknown variant: one line naming the known ones
        lock = lock_for(repro, variant, args.platform, settings=settings)
        ui.info(f"wheelhouse {repro.name} {variant}: downloading what {lock.name} pins")
        total = wheelhouse.download(
            lock, args.out.resolve(), python=python, lock_python=lock_python,
            tag=args.tag or wheelhouse.DEFAULT_TAG, settings=settings,
        )  # fmt: skip
    if total is not None:
        checked = "hashes checked" if total.hashes_checked else "hashes NOT checked (other Python)"
        ui.info(
            f"wheelhouse: {len(total.files)} files, {total.bytes / 2**20:.1f} MiB in "
            f"{total.path} ({checked}); install from it with REPROBOX_WHEELHOUSE={total.path}"
        )
    return 0
