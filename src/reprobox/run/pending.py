"""A cell on its way through the pipeline (`Pending`): its record fills in as steps succeed,
a step's failure becomes the record (`recording`), every record is saved with a full disk
said plainly (`save`), and each case of an ended launch goes through the one judge.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reprobox.core.cells import Cell, script_args
from reprobox.core.errors import ExitCode, ReproboxError, interrupt_code
from reprobox.core.files import atomic_write
from reprobox.core.judge import Judgement, Launched, Status, judge, peek_verdict
from reprobox.core.protocol import SCHEMA_VERSION, Verdict
from reprobox.core.records import Record
from reprobox.core.spec import Repro
from reprobox.run import reads
from reprobox.run.backend import RESULT_FILE, Case, LaunchRequest, Prepared


@dataclass
class Pending:
    """A cell on its way through the pipeline: its record fills in as steps succeed."""

    cell: Cell
    record: Record
    run_dir: Path
    prepared: Prepared | None = None

    @property
    def open(self) -> bool:
        """Still to be launched: nothing failed and no verdict yet (e.g. from preflight)."""
        return self.record.exit_code == 0 and self.record.verdict is None


@contextmanager
def recording(pending: list[Pending]):  # type: ignore[no-untyped-def]
    """Turn a failure of this step into the records of these cells; save them on an
    interrupt (Ctrl-C, SIGTERM, SIGHUP), with the interrupt's own exit code."""
    try:
        yield
    except ReproboxError as exc:
        for item in pending:
            item.record.reason, item.record.exit_code = str(exc), int(exc.exit_code)
    except KeyboardInterrupt as exc:
        code = int(interrupt_code(exc))
        for item in pending:
            if item.record.status == Status.ERROR.value and item.record.verdict is None:
                item.record.reason, item.record.exit_code = "interrupted", code
            save(item.record)
        raise


def cannot_test(repro: Repro, item: Pending, reason: str, by: str) -> None:
    """End a cell "cannot test here" on the harness's own finding (`by`), through the one
    judge as a script's cannot-test result would: the result names who decided."""
    case = Case(item.cell, tuple(script_args(repro, item.cell)), item.run_dir)
    result = {"schema": SCHEMA_VERSION, "verdict": Verdict.CANNOT_TEST.value, "reason": reason}
    atomic_write(case.result, json.dumps({**result, "metrics": {}, "by": by}))
    launched = Launched(logs=item.run_dir)
    item.record.apply(judge_case(repro, case, launched, [Verdict.CANNOT_TEST]), launched)


def judge_launch(
    repro: Repro, group: list[Pending], request: LaunchRequest, launched: Launched
) -> None:
    """Each case of an ended launch through the one judge."""
    verdicts = [peek_verdict(case.result) for case in request.cases]
    known = [v for v in verdicts if v is not None]
    read = reads.files_read(request.lead.run_dir, repro.dir, repro.fixes_dir)
    for item, case in zip(group, request.cases, strict=True):
        # A batch's ranks exit with the code of all its cases together.
        together = known if len(group) > 1 and len(known) == len(group) else None
        item.record.apply(judge_case(repro, case, launched, together), launched)
        item.record.files_read = read  # a batch's: every case of its one launch


def judge_case(
    repro: Repro, case: Case, launched: Launched, verdicts: list[Verdict] | None
) -> Judgement:
    """The one judge, with the variant's own rule and the cell's expectation."""
    cell = case.cell
    return judge(
        repro.rules(cell.variant), cell.expect, cell.also_ok, case.result, launched, verdicts
    )


def finish(
    group: list[Pending], records: list[Record], on_record: Callable[[Record], None] | None
) -> None:
    for item in group:
        save(item.record)
        records.append(item.record)
        if on_record is not None:
            on_record(item.record)


def save(record: Record) -> None:
    """Save a record; a full or read-only results folder is one plain error, and what the
    run wrote (result, logs) stays where it is."""
    try:
        record.save()
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        why = "the disk is full" if full else (exc.strerror or str(exc))
        raise ReproboxError(
            f"cannot save the record of {record.repro} {record.label}: {why}; "
            f"{what_is_kept(Path(record.dir))}",
            exit_code=ExitCode.HARNESS_FAILED,
        ) from None


def what_is_kept(run_dir: Path) -> str:
    """What a run left in its folder, as it is on disk: a message names only what exists (a
    full disk may have stopped the run before its folder, its logs or its result). A folder
    left empty is removed, as a cell that never started leaves none."""
    try:
        files = [p for p in run_dir.iterdir() if p.is_file() and p.stat().st_size > 0]
    except OSError:
        files = []
    logs = sorted(p.name for p in files if p.suffix == ".log")
    if any(p.name == RESULT_FILE for p in files):
        return f"its result{' and logs are' if logs else ' is'} kept in {run_dir}"
    if logs:
        return f"no result was written; its logs ({', '.join(logs)}) are kept in {run_dir}"
    if not any(run_dir.iterdir() if run_dir.is_dir() else ()):
        remove_if_empty(run_dir)
    return "nothing was measured or logged" + (
        f" (its run folder {run_dir} holds no result and no log)" if run_dir.exists() else ""
    )


def remove_if_empty(run_dir: Path) -> None:
    """Drop the folder of a cell that never started; never one holding anything."""
    for path in (run_dir, run_dir.parent):
        try:
            path.rmdir()
        except OSError:
            return


def exit_code(records: Iterable[Record]) -> ExitCode:
    """First error's code; else FAILED when a clean or reproduced verdict missed its
    expectation; else CANNOT_TEST when a cell could not be tested here (each record's code
    is the judge's); else OK."""
    records = list(records)
    for record in records:
        if record.status == Status.ERROR.value:
            return ExitCode(record.exit_code)
    codes = {r.exit_code for r in records}
    for code in (ExitCode.FAILED, ExitCode.UNDECIDED, ExitCode.CANNOT_TEST):
        if code in codes:
            return code
    return ExitCode.OK
