"""`run` and `image`: run a repro's cells (in venvs, on Slurm, or in its pinned images) and
judge them against repro.toml. `cli.main` adds them with `register(subparsers)`."""

from __future__ import annotations

import argparse
from dataclasses import replace

from reprobox.cli import cells, options, table_drawing, ui
from reprobox.core import spec
from reprobox.core.cells import Cell
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.run import capabilities, pipeline, resume
from reprobox.run.backends import make_backend


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `run` and `image` to the `reprobox` parser."""
    run = subparsers.add_parser("run", help="run variants and judge them against expectations")
    run.add_argument("repro", help="the repro to run (see `reprobox list`)")
    options.add(
        run, *options.CELL, "matrix", "echo", "resume", "workers", *options.BACKEND, "format"
    )
    options.add(run, "json")
    run.set_defaults(handler=cmd_run)

    image = subparsers.add_parser("image", help="build a variant's pinned image (and --run it)")
    image.add_argument("repro", help="the repro whose image to build (see `reprobox list`)")
    options.add(image, *options.CELL)
    image.add_argument("--run", action="store_true", help="run the variant in the image")
    options.add(image, "base", "ca_bundle", "engine")
    image.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    image.add_argument(
        "--push",
        metavar="REGISTRY",
        help="push each image to REGISTRY/<repro> and record its digest for `reprobox k8s` "
        "(oci:DIR: a local OCI layout, podman only)",
    )
    image.add_argument(
        "--memory",
        help="memory bound of each --run container, e.g. 16g (default: 4g per rank + 1g)",
    )
    options.add(image, "format")
    image.set_defaults(handler=cmd_image)


def cmd_run(args: argparse.Namespace) -> int:
    settings = options.settings(args)
    repro = spec.load(settings.root, args.repro)
    selected = cells.selected(repro, args)
    chosen = cells.backend(args)
    kept = _resumed(repro, selected, settings, chosen.name) if args.resume else {}
    ran = iter(cells.run(repro, [c for c in selected if c.label not in kept], chosen, args))
    records = [kept[c.label] if c.label in kept else next(ran) for c in selected]
    if args.json:  # one document on stdout (`cli.jsonout`); the rest went to stderr
        return cells.conclude_json(records)
    table_drawing.verdict_table(records, format=args.format, tally=True)
    cells.say_commits(records)
    return cells.conclude(records)


def _resumed(
    repro: spec.Repro, selected: list[Cell], settings: Settings, backend: str
) -> dict[str, Record]:
    """`--resume`: the records of the cells that need not run again, by label, each said
    in one line, as is why each other cell runs."""
    kept: dict[str, Record] = {}
    for found in resume.split(repro, selected, RecordStore(settings.results), settings, backend):
        if found.record is not None:
            kept[found.cell.label] = found.record
            ui.info(
                f"resume: skipped {repro.name} {found.cell.label}: {found.why} "
                "(same lock, code and arguments)"
            )
        else:
            ui.info(f"resume: running {repro.name} {found.cell.label}: {found.why}")
    return kept


def cmd_image(args: argparse.Namespace) -> int:
    """Build each selected cell's image; with --run, run the cells in them through the same
    pipeline (preflight, batching, judge) as venv runs."""
    settings = options.settings(args)
    if args.ca_bundle:
        settings = replace(settings, ca_bundle=args.ca_bundle)
    repro = spec.load(settings.root, args.repro)
    selected = cells.selected(repro, args)
    backend = make_backend("container", settings, replace(cells.flags(args), workers=1))
    images = capabilities.images(backend)
    assert images is not None, "the container back end builds images"
    if not args.run or args.push:
        for cell in selected:
            lock = pipeline.lock_for(
                repro, cell.variant, cell.platform, dict(cell.packages), settings=settings
            )
            prepared = images.prepare(repro, cell, lock)
            if args.push:
                pushed = images.push(prepared, args.push)
                ui.info(f"pushed {pushed.reference} ({cell.label})")
    if not args.run:
        _say_built(images)
        return 0
    records = cells.run(repro, selected, images, args)
    _say_built(images)
    table_drawing.verdict_table(records, format=args.format, tally=True)
    return cells.conclude(records)


def _say_built(backend: capabilities.BuildsImages) -> None:
    for tag, built, seconds in dict.fromkeys(backend.built):
        state = f"built in {seconds:.0f}s" if built else "already built"
        ui.info(f"image {tag}: {state} ({backend.engine_name})")
