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
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reprobox.cli import bundle as bundle_cli
from reprobox.cli import export as export_cli
from reprobox.cli import gpu_check as gpu_check_cli
from reprobox.cli import listing as list_cli
from reprobox.cli import report as report_cli
from reprobox.cli import scaleout as scaleout_cli
from reprobox.cli import ui
from reprobox.cli import verdict as verdict_cli
from reprobox.cli import wheelhouse as wheelhouse_cli
from reprobox.core import cells as matrix
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode, ReproboxError
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.envs.index import IndexAxes, SimpleIndex, version_range
from reprobox.run import pipeline as workflow
from reprobox.run.backend import Backend
from reprobox.run.backends.venv import VenvBackend

if TYPE_CHECKING:
    from reprobox.bisect.prober import Target


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; `verdict` ends only in `git bisect run`'s codes (an argparse
    error or an uncaught exception included: `verdict_cli.bisect_code`)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if not verdict_cli.is_verdict(words):
        return _main(words)
    try:
        return verdict_cli.bisect_code(_main(words))
    except SystemExit as exc:  # argparse: bad flags (2), --help (0)
        return verdict_cli.bisect_code(exc.code if isinstance(exc.code, int) else 2)
    except KeyboardInterrupt:  # before or after the handled block
        return int(ExitCode.INTERRUPTED)
    except BaseException as exc:  # never a traceback that `git bisect run` reads as "bad"
        ui.error(f"internal error: {type(exc).__name__}: {exc} (please report it)")
        return verdict_cli.STOP


def _main(argv: Sequence[str]) -> int:
    from reprobox.core.errors import interrupt_code
    from reprobox.run import interrupts

    parser = _parser()
    args = parser.parse_args(argv)
    results = "results/"
    # SIGTERM (a cancelled CI job, timeout(1), nox) and SIGHUP (a closed terminal) end a
    # run as Ctrl-C does: ranks killed, the cell recorded as interrupted, one line, 143/129.
    with interrupts.handled():
        try:
            spec.check_timeout(getattr(args, "timeout", None), "--timeout")
            spec.check_overrides(getattr(args, "packages", None) or [], "--with")
            args.settings = Settings.from_env()  # read once, here, and passed down
            if getattr(args, "timeout", None):  # the host torch probe waits no longer
                args.settings = replace(args.settings, host_probe_timeout=args.timeout)
            ui.configure(args.settings)
            results = str(args.settings.results)
            return int(args.handler(args))
        except ReproboxError as exc:
            ui.error(str(exc))
            return int(exc.exit_code)
        except KeyboardInterrupt as exc:
            code = interrupt_code(exc)
            what = {
                ExitCode.TERMINATED: "terminated (SIGTERM)",
                ExitCode.HANGUP: "hung up (SIGHUP)",
            }.get(code, "interrupted")
            ui.error(f"{what}; results measured so far are kept under {results}")
            return int(code)
        except OSError as exc:  # a full or read-only results folder or cache, say
            where = f" ({exc.filename})" if exc.filename else ""
            ui.error(
                f"{exc.strerror or exc}{where}; results measured so far are kept under {results}"
            )
            return int(ExitCode.HARNESS_FAILED)
        except Exception as exc:  # never a traceback that `git bisect run` reads as "bad"
            ui.error(f"internal error: {type(exc).__name__}: {exc} (please report it)")
            return int(ExitCode.HARNESS_FAILED)


def _settings(args: argparse.Namespace) -> Settings:
    return getattr(args, "settings", None) or Settings.from_env()


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
environment failed, 4 the run failed (a rank crashed or contradicts its result), 5 no
container engine, 6 a lock or image fails its hash, 70 the harness failed, 124 timeout,
129/130/143 hung up/interrupted/terminated; `verdict` answers 0 clean / 1 reproduced /
125 cannot test and 255 for anything else, as `git bisect run` expects.
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
    _workers_argument(run, "launches")
    _backend_arguments(run)
    _format_argument(run)
    run.set_defaults(handler=cmd_run)

    verdict_cli.register(commands, _cell_arguments, _backend_arguments, cmd_verdict)

    bisect = commands.add_parser(
        "bisect",
        help="find the release (or date) where a variant's verdict flips",
        description="Binary-search the releases of one package (or the days of the stack's "
        "history) for where a variant's verdict flips. The answer says what it assumed (one "
        "change between the ends) and is checked against extra probes (--verify) and every "
        "verdict already on disk; a contradiction makes it non-monotone (exit 1), never found.",
    )
    bisect.add_argument("repro", help="the repro to bisect (see `reprobox list`)")
    bisect.add_argument("--package", help="the package whose releases to search")
    bisect.add_argument("--good", help="a release where the variant is clean")
    bisect.add_argument("--bad", help="a release where the variant reproduces")
    bisect.add_argument("--variant", help="the variant to run at each probe")
    bisect.add_argument(
        "--by-date", metavar="START..END", help="bisect over days (UTC) instead of releases"
    )
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
    bisect.add_argument(
        "--verify",
        type=int,
        metavar="K",
        help="probe K more items spread over each side of the answer (default: 2 when the "
        "range holds more than 8, else 0)",
    )
    bisect.add_argument("--log", type=Path, help="probe log (default: derived from arguments)")
    bisect.add_argument(
        "--platform", default="cpu", choices=["cpu", "gpu"], help="where to run (default: cpu)"
    )
    bisect.add_argument("--timeout", type=float, help="seconds per probe")
    bisect.add_argument(
        "--commits",
        action="store_true",
        help="bisect the package's git history (--good/--bad are refs; without them, the "
        "release tags around a finished release bisect of this repro)",
    )
    bisect.add_argument(
        "--repo",
        metavar="URL_OR_PATH",
        help="with --commits: the package's repository (default: the Source URL its "
        "installed metadata names)",
    )
    bisect.add_argument(
        "--tag-format",
        metavar="FORMAT",
        help="with --commits: how release tags are spelled, e.g. 'release-{version}' "
        "(default: v{version} or {version})",
    )
    bisect.add_argument(
        "--first-parent",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="with --commits: walk the first-parent history only (default true: a merged "
        "pull request is one step); false descends into a merge to the commit inside it",
    )
    _source_arguments(bisect)
    _workers_argument(bisect, "probes")
    _backend_arguments(bisect)
    bisect.set_defaults(handler=cmd_bisect)

    sweep = commands.add_parser(
        "sweep",
        help="probe every release in a range and print the affected versions",
        description="Probe every release of one package in a range (yanked ones too, marked) "
        "and print where the variant reproduces as advisory-style ranges "
        "(`>=4.44.2,<4.46.0; ==4.47.0`) with introduced / fixed events. Assumes nothing "
        "about how often the verdict changes.",
    )
    sweep.add_argument("repro", help="the repro to sweep (see `reprobox list`)")
    sweep.add_argument("--package", help="the package whose releases to probe")
    sweep.add_argument(
        "--range",
        required=True,
        metavar="SPEC",
        help="the releases, e.g. '>=4.44.2,<=4.49.0' or 4.44.2..4.49.0 (both ends in)",
    )
    sweep.add_argument("--variant", help="the variant to run at each probe")
    sweep.add_argument("--log", type=Path, help="probe log (default: derived from arguments)")
    sweep.add_argument(
        "--platform", default="cpu", choices=["cpu", "gpu"], help="where to run (default: cpu)"
    )
    sweep.add_argument("--timeout", type=float, help="seconds per probe")
    _source_arguments(sweep)
    _workers_argument(sweep, "probes")
    _backend_arguments(sweep)
    sweep.set_defaults(handler=cmd_sweep)

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

    table = commands.add_parser("table", help="the newest measured verdict of every cell on disk")
    table.add_argument("repros", nargs="*", metavar="REPRO", help="only these (default: all)")
    table.add_argument("--default", action="store_true", help="only the default cells")
    _format_argument(table)
    table.set_defaults(handler=cmd_table)

    report_cli.register(commands)
    export_cli.register(commands)
    bundle_cli.register(commands)
    wheelhouse_cli.register(commands)
    gpu_check_cli.register(commands)
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


def _workers_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="K",
        help=f"run K {what} at once (default 1); a bisect then cuts the open range into "
        "K+1 parts a round",
    )


def _backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=["venv", "slurm"],
        default="venv",
        help="where launches run: venv (this machine, default) or slurm (one batch job per "
        "launch, one array job for a run of several; the results folder and cache must be on "
        "a file system the nodes share)",
    )
    parser.add_argument("--partition", help="slurm: the partition to submit to")
    parser.add_argument("--gres", metavar="GRES", help="slurm: generic resources, e.g. gpu:1")
    parser.add_argument(
        "--time",
        metavar="LIMIT",
        help="slurm: the job time limit (minutes, or [D-]HH:MM:SS; default: the timeout plus "
        "a minute)",
    )
    parser.add_argument(
        "--container-image",
        metavar="IMAGE",
        help="slurm: run the jobs in this image through pyxis/enroot (an enroot URI or a "
        "squashfs path; the shared paths are mounted at the same paths)",
    )
    parser.add_argument(
        "--container-mounts",
        metavar="SRC:DST[,...]",
        help="slurm: more pyxis mounts, with --container-image",
    )
    parser.add_argument(
        "--nodes", type=int, metavar="N",
        help="slurm: every launch over N nodes, one task per node ([launch] processes ranks "
        "each; default: [launch] nodes)",
    )  # fmt: skip


def _backend(args: argparse.Namespace) -> Backend | None:
    """The back end the flags ask for: None for the plain venv back end (one launch at a
    time), a runner process per launch for --workers K, or Slurm (checked before anything
    runs: its client tools, its controller, the partition)."""
    from reprobox.run.backends import detached, slurm

    workers = getattr(args, "workers", 1)
    if workers < 1:
        raise BadInput("--workers must be 1 or more")
    kind = getattr(args, "backend", "venv")
    if kind != "slurm":
        flags = ("partition", "gres", "time", "container_image", "container_mounts", "nodes")
        given = [f for f in flags if getattr(args, f, None)]
        if given:
            raise BadInput(f"--{given[0].replace('_', '-')} goes with --backend slurm")
        return detached.DetachedBackend(_settings(args)) if workers > 1 else None
    if args.nodes is not None and not 1 <= args.nodes <= spec.MAX_NODES:
        raise BadInput(f"--nodes {args.nodes}: from 1 to {spec.MAX_NODES}")
    backend = slurm.SlurmBackend(
        _settings(args), partition=args.partition, gres=args.gres, time=args.time,
        container_image=args.container_image, container_mounts=args.container_mounts,
        nodes=args.nodes,
    )  # fmt: skip
    backend.check()
    return backend


def _cell_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", action="append", help="variant name (repeatable)")
    parser.add_argument(
        "--with",
        dest="packages",
        action="append",
        default=[],
        metavar="PKG==VERSION",
        help="run at another version of a pinned package, or at a git ref of it: "
        "PKG@git+URL@REF (a branch, tag, sha or refs/pull/N/head; the commit is recorded) "
        "(repeatable)",
    )
    parser.add_argument(
        "--with-editable",
        dest="editables",
        action="append",
        default=[],
        metavar="PKG=PATH",
        help="run a pinned package from a checkout as it is now, uncommitted changes "
        "included (built at each run; the commit and tree are recorded) (repeatable)",
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


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    """Package overrides: `PKG==VERSION`, `PKG@git+URL@REF`, and `--with-editable PKG=PATH`
    (as a `file://` source)."""
    found: dict[str, str] = {}
    for item in args.packages:
        name, at, source = item.partition("@")
        if at and "==" not in name:
            if not source.strip().startswith("git+") or not name.strip():
                raise BadInput(
                    f"--with {item!r} is not of the form PKG==VERSION or PKG@git+URL@REF"
                )
            from reprobox.envs.git import split_source

            split_source(source.strip())  # a missing @REF is said here, before any work
            found[name.strip()] = source.strip()
        else:
            found.update(_pairs([item], "==", "--with"))
    for name, path in _pairs(getattr(args, "editables", []), "=", "--with-editable").items():
        if name in found:
            raise BadInput(f"--with-editable {name}: also given with --with")
        found[name] = Path(path).expanduser().resolve().as_uri()
    return found


def _pairs(items: Sequence[str], sep: str, what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key or not value:
            raise BadInput(f"{what} {item!r} is not of the form NAME{sep}VALUE")
        pairs[key.strip()] = value.strip()
    return pairs


def _cells(repro: spec.Repro, args: argparse.Namespace) -> list[matrix.Cell]:
    """The cells the arguments select (the rules live in core.cells); a range axis says
    which releases it left out (yanked, pre-releases)."""
    axes = _axes(args)  # the index is read only for a range axis of --matrix
    cells = matrix.requested_cells(
        repro,
        args.variant or (),
        _overrides(args),
        _pairs(args.param, "=", "--param"),
        args.platform,
        matrix=getattr(args, "matrix", False),
        versions_in_range=axes,
    )
    for note in axes.notes():
        ui.info(f"reprobox: {note}")
    return cells


def _index(args: argparse.Namespace) -> SimpleIndex:
    return SimpleIndex.from_settings(_settings(args))


def _axes(args: argparse.Namespace) -> IndexAxes:
    return IndexAxes(_index(args))


def _options(args: argparse.Namespace) -> workflow.RunOptions:
    return workflow.RunOptions(
        platform=args.platform,
        timeout=args.timeout,
        echo=sys.stderr if getattr(args, "echo", False) else None,
        workers=getattr(args, "workers", 1),
    )


def _run(
    repro: spec.Repro, cells: list[matrix.Cell], backend: Backend, args: argparse.Namespace
) -> list[Record]:
    store = RecordStore(_settings(args).results)
    with ui.CellProgress(repro.name, len(cells)) as progress:
        return workflow.run_cells(
            repro,
            cells,
            backend,
            store,
            _settings(args),
            _options(args),
            on_start=progress.start,
            on_record=progress.done,
        )


def cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    repro = spec.load(settings.root, args.repro)
    cells = _cells(repro, args)
    records = _run(repro, cells, _backend(args) or VenvBackend(settings), args)
    ui.verdict_table(records, format=args.format)
    _say_commits(records)
    return _conclude(records)


def _say_commits(records: list[Record]) -> None:
    """Which commit ran, for cells at a git ref or a checkout (the record keeps it too)."""
    for record in records:
        for package, commit in record.commits.items():
            ui.info(f"{record.label}: {package} at commit {commit}")


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
    """One variant, `git bisect run` exit codes: 0 clean, 1 reproduced, 125 cannot test (or
    an environment that cannot be resolved or installed); anything else is 255, which stops
    a `git bisect run`, so a harness failure is never read as "bad"."""
    settings = _settings(args)
    repro = spec.load(settings.root, args.repro)
    cells = _cells(repro, args)
    if len(cells) != 1:
        raise BadInput("verdict takes exactly one --variant")
    store = RecordStore(settings.results)
    backend = _backend(args) or VenvBackend(settings)
    [record] = workflow.run_cells(repro, cells, backend, store, settings, _options(args))
    ui.record_line(record)
    _say_commits([record])
    if record.verdict is not None and record.status != "error":
        return Verdict(record.verdict).exit_code
    if record.exit_code not in (ExitCode.ENV_FAILED, ExitCode.CANNOT_TEST):  # skips
        ui.error(record.reason)
    return verdict_cli.bisect_code(record.exit_code)


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    """--with / --with-editable of a bisect or sweep: other packages every probe runs at."""
    parser.add_argument(
        "--with",
        dest="packages",
        action="append",
        default=[],
        metavar="PKG==VERSION",
        help="run every probe with another package at a version, or at a git ref: "
        "PKG@git+URL@REF (resolved to one commit when the bisect starts, named in the "
        "summary) (repeatable; not the package searched)",
    )
    parser.add_argument(
        "--with-editable",
        dest="editables",
        action="append",
        default=[],
        metavar="PKG=PATH",
        help="run every probe with a package built from a checkout as it is now (a change "
        "to it mid-bisect stops the bisect) (repeatable)",
    )


def _bisect_target(args: argparse.Namespace) -> tuple[Target, spec.BisectSection | None]:
    """The repro and variant every probe runs, from the flags or [bisect], and the other
    packages every probe runs at (--with, --with-editable)."""
    from reprobox.bisect.prober import Target  # bisects only: a run need not import it

    settings = _settings(args)
    repro = spec.load(settings.root, args.repro)
    defaults = repro.spec.bisect
    variant = args.variant or (defaults.variant if defaults else None)
    if variant is None:
        raise BadInput(f"--variant is needed: {repro.name} has no [bisect] variant")
    repro.variant(variant)
    overrides = _overrides(args)
    target = Target(repro, variant, _options(args), settings, _backend(args), overrides=overrides)
    return target, defaults


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def cmd_bisect(args: argparse.Namespace) -> int:
    from reprobox.bisect import commits, dates, releases

    target, defaults = _bisect_target(args)
    if args.confirm < 0:
        raise BadInput("--confirm must be 0 or more")
    if not args.commits and (args.repo or args.tag_format or args.first_parent is not True):
        raise BadInput("--repo, --tag-format and --first-parent go with --commits")
    if args.workers > 1 and (args.commits or args.by_date):
        ui.info("reprobox: --workers applies to release bisects; this one probes one at a time")
    with ui.BisectProgress(target.repro.name) as progress:
        if args.commits:
            if args.by_date:
                raise BadInput("--commits and --by-date are two kinds of bisect: pick one")
            package = args.package or (defaults.package if defaults else None)
            if not package:
                raise BadInput("--package is needed (no [bisect] package)")
            summary = commits.commit_bisect(
                target,
                package,
                repo=args.repo,
                good=args.good,
                bad=args.bad,
                tag_format=args.tag_format,
                first_parent=args.first_parent,
                confirm=args.confirm,
                verify=args.verify,
                log_path=args.log,
                on_probe=progress.probe,
            )
        elif args.by_date:
            start, end = dates.parse_dates(args.by_date)
            floats = args.float or (defaults.float or [defaults.package] if defaults else [])
            summary = dates.date_bisect(
                target,
                start,
                end,
                floats,
                index=_index(args),
                confirm=args.confirm,
                verify=args.verify,
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
            summary = releases.release_bisect(
                target,
                package,
                good,
                bad,
                _index(args),
                confirm=args.confirm,
                verify=args.verify,
                log_path=args.log,
                on_probe=progress.probe,
                workers=args.workers,
            )
    ui.bisect_summary(summary)
    # Only "found" and "ambiguous" are answers; flaky and non-monotone histories are not.
    return int(ExitCode.FAILED if summary.status in ("flaky", "non-monotone") else ExitCode.OK)


def cmd_sweep(args: argparse.Namespace) -> int:
    from reprobox.bisect import sweep

    version_range(args.range)  # a bad --range is said before the index is asked
    target, defaults = _bisect_target(args)
    package = args.package or (defaults.package if defaults else None)
    if not package:
        raise BadInput("--package is needed (no [bisect] package)")
    with ui.BisectProgress(target.repro.name, verb="sweeping") as progress:
        summary = sweep.sweep(
            target,
            package,
            args.range,
            _index(args),
            log_path=args.log,
            on_probe=progress.probe,
            workers=args.workers,
        )
    ui.bisect_summary(summary)
    return int(ExitCode.OK)


def cmd_image(args: argparse.Namespace) -> int:
    """Build each selected cell's image; with --run, run the cells in them through the same
    pipeline (preflight, batching, judge) as venv runs."""
    from reprobox.run.backends import container

    settings = _settings(args)
    if args.ca_bundle:
        settings = replace(settings, ca_bundle=Path(args.ca_bundle))
    repro = spec.load(settings.root, args.repro)
    cells = _cells(repro, args)
    backend = container.ContainerBackend(
        settings, container.find_engine(args.engine), base=args.base, no_cache=args.no_cache,
        memory=args.memory,
    )  # fmt: skip
    if not args.run or args.push:
        for cell in cells:
            lock = workflow.lock_for(
                repro, cell.variant, cell.platform, dict(cell.packages), settings=settings
            )
            prepared = backend.prepare(repro, cell, lock)
            if args.push:
                pushed = container.push(backend.engine, prepared.handle, args.push,
                                        settings.results)  # fmt: skip
                ui.info(f"pushed {pushed.reference} ({cell.label})")
    if not args.run:
        _say_built(backend)
        return 0
    records = _run(repro, cells, backend, args)
    _say_built(backend)
    ui.verdict_table(records, format=args.format)
    return _conclude(records)


def _say_built(backend: Any) -> None:
    for tag, built, seconds in dict.fromkeys(backend.built):
        state = f"built in {seconds:.0f}s" if built else "already built"
        ui.info(f"image {tag}: {state} ({backend.engine.name})")


def cmd_list(args: argparse.Namespace) -> int:
    root = _settings(args).root
    if args.name is not None:
        detail = list_cli.detail(spec.load(root, args.name), _axes(args))
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

    settings = _settings(args)
    root = settings.root
    names = args.repros or spec.discover(root)

    def written(path: Path) -> None:
        ui.info(f"{path.relative_to(root)}: written")

    problems = regenerate(settings, names, check=args.check, on_written=written)
    if problems:
        raise BadInput(f"out of date with repro.toml: {'; '.join(problems)}; run `nox -s lock`")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from reprobox.cli import table as table_cli

    return table_cli.show(_settings(args), args.repros, args.default, args.format)


if __name__ == "__main__":
    sys.exit(main())
