"""`reprobox` command line: parse arguments, call the layers below, turn errors into one line.

The modules below the CLI never print tracebacks at users and never call sys.exit; this is
the only place that maps a `ReproboxError` to its message and exit code. What users read in
`reprobox --help` is `_DESCRIPTION` and `_EPILOG`, not this docstring. Command groups live in
their own modules (`cli.report`, `cli.scaleout`), each adding its subcommands with
`register(subparsers)`; `cli.ui` draws everything a person sees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from reprobox.cli import listing as list_cli
from reprobox.cli import report as report_cli
from reprobox.cli import scaleout as scaleout_cli
from reprobox.cli import ui
from reprobox.core import cells as matrix
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode, ReproboxError
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, latest_records, results_dir
from reprobox.run import pipeline as workflow


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ReproboxError as exc:
        ui.error(str(exc))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        ui.error(f"interrupted; results measured so far are kept under {results_dir(_root())}")
        return int(ExitCode.INTERRUPTED)


def _root() -> Path:
    return spec.repo_root()


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
environment failed, 4 the run failed, 5 no container engine, 124 timeout, 130
interrupted; `verdict` answers 0 clean / 1 reproduced / 125 cannot test (git bisect run).
`reprobox COMMAND --help` describes each command."""


def _version() -> str:
    """The installed distribution's version (what a bug report should quote)."""
    try:
        return metadata.version("reprobox")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a distribution)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reprobox",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"reprobox {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of:"
    )

    listing = commands.add_parser(
        "list",
        help="repros, their variants and matrix cells (NAME: one repro in full)",
        description="Without NAME: every repro with its variants. With NAME: one repro in "
        "full: variants, verdict rule, launch, bisect defaults and every cell with the "
        "`reprobox run` arguments that select it.",
    )
    listing.add_argument("name", nargs="?", metavar="NAME", help="one repro to show in full")
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")
    listing.set_defaults(handler=cmd_list)

    run = commands.add_parser("run", help="run variants and judge them against expectations")
    run.add_argument("repro", help="the repro to run (see `reprobox list`)")
    _cell_arguments(run)
    run.add_argument("--matrix", action="store_true", help="run every cell of [matrix]")
    run.add_argument("--echo", action="store_true", help="stream the launcher's output")
    _format_argument(run)
    run.set_defaults(handler=cmd_run)

    verdict = commands.add_parser(
        "verdict",
        help="run one variant; exit 0 clean / 1 reproduced / 125 cannot test (git bisect run)",
    )
    verdict.add_argument("repro", help="the repro to run (see `reprobox list`)")
    _cell_arguments(verdict)
    verdict.set_defaults(handler=cmd_verdict)

    bisect = commands.add_parser(
        "bisect", help="find the release (or date) where a variant's verdict flips"
    )
    bisect.add_argument("repro")
    bisect.add_argument("--package", help="the package whose releases to search")
    bisect.add_argument("--good", help="a release where the variant is clean")
    bisect.add_argument("--bad", help="a release where the variant reproduces")
    bisect.add_argument("--variant", help="the variant to run at each probe")
    bisect.add_argument("--by-date", metavar="START..END", help="bisect over days instead")
    bisect.add_argument(
        "--float",
        action="append",
        default=[],
        metavar="PKG",
        help="by date: resolve this package as of each day (repeatable)",
    )
    bisect.add_argument(
        "--confirm",
        type=int,
        default=1,
        metavar="N",
        help="re-run each boundary probe N more times to catch flakiness (default 1)",
    )
    bisect.add_argument("--log", type=Path, help="probe log (default: derived from arguments)")
    bisect.add_argument("--platform", default="cpu", choices=["cpu", "gpu"])
    bisect.add_argument("--timeout", type=float, help="seconds per probe")
    bisect.set_defaults(handler=cmd_bisect)

    image = commands.add_parser("image", help="build a variant's pinned image (and --run it)")
    image.add_argument("repro", help="the repro whose image to build (see `reprobox list`)")
    _cell_arguments(image)
    image.add_argument("--run", action="store_true", help="run the variant in the image")
    image.add_argument("--base", help="base image (e.g. a local stand-in for python:3.11-slim)")
    image.add_argument(
        "--ca-bundle",
        type=Path,
        default=os.environ.get("REPROBOX_CA_BUNDLE") or None,
        help="extra CA bundle for the build (TLS-intercepting proxies; env REPROBOX_CA_BUNDLE)",
    )
    image.add_argument("--engine", choices=["podman", "docker"], help="default: whichever works")
    image.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    _format_argument(image)
    image.set_defaults(handler=cmd_image)

    lock = commands.add_parser(
        "lock", help="regenerate (or --check) the committed locks and Dockerfiles"
    )
    lock.add_argument("repros", nargs="*", metavar="REPRO", help="only these (default: all)")
    lock.add_argument(
        "--check", action="store_true", help="write nothing; fail if a lock is stale or missing"
    )
    lock.set_defaults(handler=cmd_lock)

    table = commands.add_parser("table", help="the newest verdict of every cell on disk")
    table.add_argument("repros", nargs="*", metavar="REPRO", help="only these (default: all)")
    table.add_argument("--default", action="store_true", help="only the default cells")
    _format_argument(table)
    table.set_defaults(handler=cmd_table)

    report_cli.register(commands)
    scaleout_cli.register(commands)
    return parser


def _format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=ui.TABLE_FORMATS,
        default="auto",
        help="the verdict table: rich (a terminal), plain (aligned text, never wrapped), "
        "markdown (a pipe table); default auto: rich at a terminal, else plain",
    )


def _cell_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", action="append", help="variant name (repeatable)")
    parser.add_argument(
        "--with",
        dest="packages",
        action="append",
        default=[],
        metavar="PKG==VERSION",
        help="run at another version of a pinned package (repeatable)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a matrix parameter passed to the script (repeatable)",
    )
    parser.add_argument(
        "--platform", default="cpu", choices=["cpu", "gpu"], help="where to run (default: cpu)"
    )
    parser.add_argument("--timeout", type=float, help="seconds; overrides [launch] timeout")


def _pairs(items: Sequence[str], sep: str, what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key or not value:
            raise BadInput(f"{what} {item!r} is not of the form NAME{sep}VALUE")
        pairs[key.strip()] = value.strip()
    return pairs


def _cells(repro: spec.Repro, args: argparse.Namespace) -> list[matrix.Cell]:
    packages = _pairs(args.packages, "==", "--with")
    params = _pairs(args.param, "=", "--param")
    pinned = repro.pinned_packages()
    for package in packages:
        if canonicalize_name(package) not in pinned:
            raise BadInput(f"--with {package}: not a package that {repro.name} pins")
        spec.check_version(packages[package], f"--with {package}")
    if getattr(args, "matrix", False):
        from reprobox.envs.index import versions_in_range

        return matrix.matrix_cells(repro, versions_in_range)
    if args.variant:
        variants = args.variant
    elif (packages or params) and repro.spec.matrix:
        variants = repro.spec.matrix.variants  # a matrix point: the variants the matrix runs
    else:
        variants = repro.default_variants
    for name in variants:
        repro.variant(name)
    return [matrix.make_cell(repro, name, packages, params) for name in variants]


def _options(args: argparse.Namespace) -> workflow.RunOptions:
    return workflow.RunOptions(
        platform=args.platform,
        timeout=args.timeout,
        echo=sys.stderr if getattr(args, "echo", False) else None,
    )


def cmd_run(args: argparse.Namespace) -> int:
    root = _root()
    repro = spec.load(root, args.repro)
    cells = _cells(repro, args)
    with ui.CellProgress(repro.name, len(cells)) as progress:
        records = workflow.run_cells(
            root, repro, cells, _options(args), on_start=progress.start, on_record=progress.done
        )
    ui.verdict_table(records, format=args.format)
    return _conclude(records)


def _conclude(records: list[Record]) -> int:
    """The exit code of a run, and for a failed one its first reason as the last line."""
    code = workflow.exit_code(records)
    failed = next((r for r in records if r.exit_code == code and code != ExitCode.OK), None)
    if failed is not None and failed.status == "mismatch":
        ui.error(
            f"{failed.repro} {failed.label}: {failed.verdict}, expected {failed.expect} "
            f"({failed.reason})"
        )
    elif failed is not None:
        ui.error(f"{failed.repro} {failed.label}: {failed.reason}")
    return int(code)


def cmd_verdict(args: argparse.Namespace) -> int:
    """One variant, `git bisect run` exit codes; an environment that cannot install skips."""
    root = _root()
    repro = spec.load(root, args.repro)
    cells = _cells(repro, args)
    if len(cells) != 1:
        raise BadInput("verdict takes exactly one --variant")
    record = workflow.run_cell(root, repro, cells[0], _options(args))
    ui.record_line(record)
    if record.verdict is not None:
        return Verdict(record.verdict).exit_code
    if record.exit_code == ExitCode.ENV_FAILED:
        return int(ExitCode.CANNOT_TEST)
    ui.error(record.reason)
    return 255 if record.exit_code != ExitCode.INTERRUPTED else int(ExitCode.INTERRUPTED)


def cmd_bisect(args: argparse.Namespace) -> int:
    from reprobox.bisect import triage
    from reprobox.envs.index import SimpleIndex

    root = _root()
    repro = spec.load(root, args.repro)
    defaults = repro.spec.bisect
    variant = args.variant or (defaults.variant if defaults else None)
    if variant is None:
        raise BadInput(f"--variant is needed: {repro.name} has no [bisect] variant")
    repro.variant(variant)
    target = triage.Target(root, repro, variant, _options(args))
    if args.confirm < 0:
        raise BadInput("--confirm must be 0 or more")
    with ui.BisectProgress(repro.name) as progress:
        if args.by_date:
            start, end = triage.parse_dates(args.by_date)
            floats = args.float or (defaults.float or [defaults.package] if defaults else [])
            summary = triage.date_bisect(
                target,
                start,
                end,
                floats,
                confirm=args.confirm,
                log_path=args.log,
                on_probe=progress.probe,
            )
        else:
            package = args.package or (defaults.package if defaults else None)
            good = args.good or (defaults.good if defaults else None)
            bad = args.bad or (defaults.bad if defaults else None)
            if not (package and good and bad):
                raise BadInput("--package, --good and --bad are needed (no [bisect] defaults)")
            for name, value in (("--good", good), ("--bad", bad)):
                spec.check_version(value, name)
            summary = triage.release_bisect(
                target,
                package,
                good,
                bad,
                SimpleIndex(),
                confirm=args.confirm,
                log_path=args.log,
                on_probe=progress.probe,
            )
    ui.bisect_summary(summary)
    return int(ExitCode.FAILED if summary["status"] == "flaky" else ExitCode.OK)


def cmd_image(args: argparse.Namespace) -> int:
    from reprobox.run.backends import container as images

    root = _root()
    repro = spec.load(root, args.repro)
    cells = _cells(repro, args)
    engine = images.find_engine(args.engine)
    ca_bundle = Path(args.ca_bundle) if args.ca_bundle else None
    records = []
    with ui.CellProgress(repro.name, len(cells)) as progress:
        for cell in cells:
            image = images.image_spec(root, repro, cell.variant, args.platform, dict(cell.packages))
            logs = results_dir(root) / repro.name / "_images" / image.tag.rsplit(":", 1)[-1]
            started = time.monotonic()
            built = images.build(
                engine,
                image,
                base=args.base,
                ca_bundle=ca_bundle,
                log_dir=logs,
                no_cache=args.no_cache,
            )
            state = f"built in {time.monotonic() - started:.0f}s" if built else "already built"
            ui.info(f"image {image.tag}: {state} ({engine.name})")
            if args.run:
                progress.start([cell])
                record = images.run_cell(
                    root, engine, image, cell, _options(args), gpus=args.platform == "gpu"
                )
                progress.done(record)
                records.append(record)
    if not records:
        return 0
    ui.verdict_table(records, format=args.format)
    return _conclude(records)


def cmd_list(args: argparse.Namespace) -> int:
    root = _root()
    if args.name is not None:
        from reprobox.envs.index import versions_in_range

        detail = list_cli.detail(spec.load(root, args.name), versions_in_range)
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
    from reprobox.run.regenerate import regenerate

    root = _root()
    names = args.repros or spec.discover(root)

    def written(path: Path) -> None:
        ui.info(f"{path.relative_to(root)}: written")

    problems = regenerate(root, names, check=args.check, on_written=written)
    if problems:
        raise BadInput(f"out of date with repro.toml: {'; '.join(problems)}; run `nox -s lock`")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    root = _root()
    records = []
    for name in args.repros or spec.discover(root):
        repro = spec.load(root, name)
        found = latest_records(root, name)
        if args.default:
            wanted = {c.label for c in matrix.default_cells(repro)}
            found = [r for r in found if r.label in wanted]
        records += found
    if not records:
        raise BadInput(f"no results on disk under {results_dir(root)}; run `make repro` first")
    ui.verdict_table(records, format=args.format)
    return _conclude(records)


if __name__ == "__main__":
    sys.exit(main())
