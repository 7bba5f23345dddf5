"""`reprobox table`: the newest measured verdict of every cell on disk, when it was measured,
and the later runs of a cell that measured nothing (interrupted, errored, never launched),
each with its time. It exits by the measured verdicts: a Ctrl-C after a measured run lists
the interrupted run and never becomes the table's exit code."""

from __future__ import annotations

from collections.abc import Sequence

from reprobox.cli import table_drawing, ui
from reprobox.core import spec
from reprobox.core.cells import default_cells
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.judge import Status
from reprobox.core.records import CellHistory, RecordStore
from reprobox.core.settings import Settings
from reprobox.run import pipeline


def histories(settings: Settings, names: Sequence[str], default: bool) -> list[CellHistory]:
    """Every cell of `names` (all repros when empty), `default` keeping the default cells."""
    store = RecordStore(settings.results)
    found: list[CellHistory] = []
    for name in names or spec.discover(settings.root):
        repro = spec.load(settings.root, name)
        cells, _ = store.histories(name)
        if default:
            wanted = {c.label for c in default_cells(repro)}
            cells = [h for h in cells if h.record.label in wanted]
        found += cells
    return found


def later_runs(cells: Sequence[CellHistory]) -> list[str]:
    """One line per run newer than its cell's measured verdict that measured nothing."""
    return [
        f"{h.record.repro} {h.record.label}: a later run at {run.started_at} measured nothing "
        f"({run.reason or 'no reason recorded'}); the verdict shown was measured at "
        f"{h.record.started_at}"
        for h in cells
        for run in h.unmeasured
    ]


def conclude(cells: Sequence[CellHistory]) -> int:
    """The exit code of the measured verdicts (a missed expectation fails it); a cell with no
    measured verdict at all then decides it by its own record's code; else cannot-test or
    ok. A failure's first reason is the last line."""
    measured = [h.record for h in cells if h.is_measured]
    never = [h.record for h in cells if not h.is_measured]
    code = pipeline.exit_code(measured)
    if code != ExitCode.FAILED and never:
        code = pipeline.exit_code(never)
    failed = next(
        (r for r in [*measured, *never] if r.exit_code == code and code != ExitCode.OK), None
    )
    if failed is not None and failed.status == Status.MISMATCH:
        ui.error(
            f"{failed.repro} {failed.label}: {failed.verdict}, expected {failed.expect} "
            f"({failed.reason})"
        )
    elif failed is not None:
        what = "" if failed in measured else "no measured verdict; "
        ui.error(f"{failed.repro} {failed.label}: {what}{failed.reason}")
    return int(code)


def show(
    settings: Settings, names: Sequence[str], default: bool, format: str, as_json: bool = False
) -> int:
    """Print the table and the later unmeasured runs (with `as_json`, the records and those
    lines as one JSON document: `cli.jsonout`); the exit code of `conclude`."""
    cells = histories(settings, names, default)
    if not cells:
        raise BadInput(f"no results on disk under {settings.results}; run `make repro` first")
    if as_json:
        # start-up cost: --json only (it loads the bisect summary's models)
        from reprobox.cli import jsonout

        code = conclude(cells)
        jsonout.records("table", [h.record for h in cells], code, later_runs(cells))
        return code
    table_drawing.verdict_table(
        [h.record for h in cells], format=format, notes=later_runs(cells), tally=True
    )
    return conclude(cells)
