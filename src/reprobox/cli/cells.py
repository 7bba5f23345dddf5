"""What the cell and back-end flags select, shared by `run`, `verdict`, `image`, `bisect` and
`sweep`: the package overrides (`--with`, `--with-editable`), the cells, the package index,
the run options and the back end, and how a run of cells ends (its exit code and last line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reprobox.cli import options, ui
from reprobox.cli.progress import CellProgress
from reprobox.core import cells, spec
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.judge import Status
from reprobox.core.records import Record, RecordStore
from reprobox.envs.git import split_source
from reprobox.run import pipeline
from reprobox.run.backend import Backend
from reprobox.run.backends import BackendFlags, ContainerFlags, SlurmFlags, make_backend

if TYPE_CHECKING:
    from reprobox.envs.index import IndexAxes, SimpleIndex


def overrides(args: argparse.Namespace) -> dict[str, str]:
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

            split_source(source.strip())  # a missing @REF is said here, before any work
            found[name.strip()] = source.strip()
        else:
            found.update(pairs([item], "==", "--with"))
    for name, path in pairs(getattr(args, "editables", []), "=", "--with-editable").items():
        if name in found:
            raise BadInput(f"--with-editable {name}: also given with --with")
        found[name] = Path(path).expanduser().resolve().as_uri()
    return found


def pairs(items: Sequence[str], sep: str, what: str) -> dict[str, str]:
    """`NAME<sep>VALUE` items as a mapping; anything else is bad input naming the flag."""
    found = {}
    for item in items:
        key, sep_found, value = item.partition(sep)
        if not sep_found or not key or not value:
            raise BadInput(f"{what} {item!r} is not of the form NAME{sep}VALUE")
        found[key.strip()] = value.strip()
    return found


def selected(repro: spec.Repro, args: argparse.Namespace) -> list[cells.Cell]:
    """The cells the arguments select (the rules live in core.cells); a range axis says
    which releases it left out (yanked, pre-releases)."""
    axes = index_axes(args)  # the index is read only for a range axis of --matrix
    found = cells.requested_cells(
        repro,
        args.variant or (),
        overrides(args),
        pairs(args.param, "=", "--param"),
        args.platform,
        matrix=getattr(args, "matrix", False),
        versions_in_range=axes,
    )
    for note in axes.notes():
        ui.info(f"reprobox: {note}")
    return found


def index(args: argparse.Namespace) -> SimpleIndex:
    from reprobox.envs.index import SimpleIndex  # its HTTP client: not on the run path

    """The package index the settings name (tests replace this one function)."""
    return SimpleIndex.from_settings(options.settings(args))


def index_axes(args: argparse.Namespace) -> IndexAxes:
    # start-up cost: the package index client loads when one is asked
    from reprobox.envs.index import IndexAxes

    return IndexAxes(index(args))


def run_options(args: argparse.Namespace) -> pipeline.RunOptions:
    return pipeline.RunOptions(
        platform=args.platform,
        timeout=args.timeout,
        echo=sys.stderr if getattr(args, "echo", False) else None,
        workers=getattr(args, "workers", 1),
    )


def backend(args: argparse.Namespace) -> Backend:
    """The back end the flags ask for (the registry builds it; never None). --workers is
    checked where it is parsed (`options.positive_int`)."""
    return make_backend(getattr(args, "backend", "venv"), options.settings(args), flags(args))


def flags(args: argparse.Namespace) -> BackendFlags:
    """Every back-end flag of a command, whichever kind it goes with (the registry checks
    that each goes with the kind chosen)."""
    slurm = SlurmFlags(**{f: getattr(args, f, None) for f in SlurmFlags.__dataclass_fields__})
    container = ContainerFlags(
        engine=getattr(args, "engine", None),
        base=getattr(args, "base", None),
        memory=getattr(args, "memory", None),
        no_cache=getattr(args, "no_cache", False),
    )
    return BackendFlags(workers=getattr(args, "workers", 1), slurm=slurm, container=container)


def run(
    repro: spec.Repro, selected: list[cells.Cell], chosen: Backend, args: argparse.Namespace
) -> list[Record]:
    """Run the cells through the pipeline with a progress display; their records."""
    settings = options.settings(args)
    with CellProgress(repro.name, len(selected)) as progress:
        return pipeline.run_cells(
            repro,
            selected,
            chosen,
            RecordStore(settings.results),
            settings,
            run_options(args),
            on_start=progress.start,
            on_record=progress.done,
            on_phase=progress.phase,
        )


def say_commits(records: list[Record]) -> None:
    """Which commit ran, for cells at a git ref or a checkout (the record keeps it too)."""
    for record in records:
        for package, commit in record.commits.items():
            ui.info(f"{record.label}: {package} at commit {commit}")


def conclude(records: list[Record]) -> int:
    """The exit code of a run, and for a failed one its first reason as the last line."""
    code = pipeline.exit_code(records)
    failed = next((r for r in records if r.exit_code == code and code != ExitCode.OK), None)
    if failed is not None and failed.status == Status.MISMATCH:
        ui.error(
            f"{failed.repro} {failed.label}: {failed.verdict}, expected {failed.expect} "
            f"({failed.reason})"
        )
    elif failed is not None:
        ui.error(f"{failed.repro} {failed.label}: {failed.reason}")
    return int(code)


def conclude_json(records: list[Record]) -> int:
    """`run --json`: the commits and the failure's line on stderr as without it, then the
    records as one JSON document (`cli.jsonout`); the same exit code."""
    # start-up cost: --json only (it loads the bisect summary's models)
    from reprobox.cli import jsonout

    say_commits(records)
    code = conclude(records)
    jsonout.records("run", records, code)
    return code
