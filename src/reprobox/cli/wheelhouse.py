"""The `wheelhouse` command: every wheel and sdist the locks of some variants install, in one
folder, so a node with no internet installs them (`REPROBOX_WHEELHOUSE=DIR`). Several repros
and variants fill one folder, each pin once (`reprobox wheelhouse kl:fixed_1gpu lm_head`);
`--torch-from-host` leaves out what a host with its own torch gives (torch's family and the
platform's `host_packages`). `cli.main` adds it with `register(subparsers)`; failures raise
`ReproboxError`, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reprobox.cli import options, ui
from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.envs import wheelhouse
from reprobox.run.pipeline import lock_for


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `wheelhouse` to the `reprobox` parser."""
    parser = subparsers.add_parser(
        "wheelhouse",
        help="download every wheel/sdist a lock needs into a folder, for offline installs",
    )
    parser.add_argument(
        "targets", nargs="+", metavar="REPRO[:V,V]",
        help="a repro, or a repro and its variants (default: its default variants on the "
             "platform); several fill one folder",
    )  # fmt: skip
    options.add(parser, "variant", "platform")
    parser.add_argument(
        "--python", metavar="X.Y", help="the target's Python (default: the locks' own)"
    )
    parser.add_argument(
        "--tag", metavar="TAG", help="the target's platform tag (default: manylinux_2_28_x86_64)"
    )
    parser.add_argument(
        "--torch-from-host", action="store_true",
        help="the target has its own torch: leave out torch, triton, nvidia-*, cuda-* and the "
             "platform's host_packages (what REPROBOX_TORCH_SOURCE=host does not install)",
    )  # fmt: skip
    parser.add_argument("-o", "--out", type=Path, required=True, help="the folder to fill")
    parser.set_defaults(handler=cmd_wheelhouse)


def parse_targets(targets: list[str], variants: list[str]) -> list[tuple[str, list[str]]]:
    """`kl:a,b lm_head` -> [("kl", ["a", "b"]), ("lm_head", [])]; `--variant` names variants
    of a single repro."""
    parsed = []
    for target in targets:
        name, _, listed = target.partition(":")
        parsed.append((name, [v for v in listed.split(",") if v]))
    if variants:
        if len(parsed) != 1:
            raise BadInput("--variant needs exactly one repro; write REPRO:V,V for several")
        parsed[0][1].extend(variants)
    return parsed


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    settings = options.settings(args)
    locks: list[Path] = []
    given: dict[Path, list[str]] = {}  # per lock: the platform's host_packages
    pythons: set[str] = set()
    for name, asked in parse_targets(args.targets, args.variant):
        repro = spec.load(settings.root, name)
        repro.platform(args.platform)
        variants = list(dict.fromkeys(asked)) or [
            v for v in repro.variants_on(args.platform) if repro.variant(v).default
        ]
        pythons.add(repro.python(args.platform))
        for variant in variants:
            repro.variant(variant)  # an unknown variant: one line naming the known ones
            locks.append(lock_for(repro, variant, args.platform, settings=settings))
            given[locks[-1]] = list(repro.platform(args.platform).host_package_ranges)
            ui.info(f"wheelhouse {repro.name} {variant}: {locks[-1].name}")
    if not args.python and len(pythons) > 1:
        raise BadInput(
            f"the locks are for Pythons {', '.join(sorted(pythons))}: say the target's, --python"
        )
    lock_python = min(pythons)
    house = wheelhouse.download(
        locks, args.out.resolve(), python=args.python or lock_python,
        lock_python=lock_python if len(pythons) == 1 else "", torch_from_host=args.torch_from_host,
        host_packages=given,
        tag=args.tag or wheelhouse.DEFAULT_TAG, settings=settings,
    )  # fmt: skip
    checked = "hashes checked"
    if house.unchecked:
        checked = f"hashes NOT checked for {', '.join(house.unchecked)} (no hash in the lock)"
    ui.info(
        f"wheelhouse: {len(house.files)} files, {house.bytes / 2**20:.1f} MiB in "
        f"{house.path} ({checked}); install from it with REPROBOX_WHEELHOUSE={house.path}"
    )
    largest = ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in house.largest(5))
    ui.info(f"largest: {largest}")
    if sources := wheelhouse.sdists(house):
        ui.info(f"built at install (sdists): {', '.join(sources)}")
    if house.left_out:
        ui.info(f"left out, the host's torch gives them: {len(house.left_out)} pins")
    return 0
