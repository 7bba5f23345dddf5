"""The one pipeline behind every run: cell -> lock -> environment -> preflight -> launch ->
judge -> record, on any back end (a venv, a container engine, a cluster).

Each step can fail with a `ReproboxError`; the failure becomes the cell's record (status
`error`, a plain reason, the exit code it implies) and the next cell still runs. Only an
interrupt (Ctrl-C, SIGTERM, SIGHUP) stops the pipeline, after saving the records of the
cells it interrupted. What was measured is never deleted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reprobox.core.cells import Cell, script_args
from reprobox.core.errors import CannotTestHere, ExitCode, ReproboxError
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.run import capabilities, host_check, machine, phases, repeat_loop, resume
from reprobox.run.backend import Backend, Case, LaunchRequest, Prepared
from reprobox.run.capabilities import LaunchesConcurrently, LaunchesMany

# What callers of the pipeline ask of locks and environments (run/installs.py).
from reprobox.run.installs import ensure_env as ensure_env
from reprobox.run.installs import env_inputs as env_inputs
from reprobox.run.installs import lock_for as lock_for
from reprobox.run.installs import lock_path as lock_path
from reprobox.run.installs import lock_request as lock_request
from reprobox.run.installs import resolve_sources as resolve_sources
from reprobox.run.pending import (
    Pending,
    cannot_test,
    finish,
    judge_case,
    judge_launch,
    recording,
    remove_if_empty,
    save,
)
from reprobox.run.pending import exit_code as exit_code

STOPPED_MID_LAUNCH = (
    "no verdict was recorded for this launch: the harness was killed, or could not write "
    "the record (a full disk?)"
)


@dataclass(frozen=True)
class RunOptions:
    platform: str = "cpu"  # for `run_cell` callers that build platform-less cells
    echo: TextIO | None = None  # stream the launcher's output here
    timeout: float | None = None  # overrides [launch] timeout
    lock: Path | None = None  # run against this lock instead (date-bisection probes)
    results_base: Path | None = None  # keep run dirs here instead (bisection probes)
    workers: int = 1  # launches at once, on a back end that allows it (`concurrent`)
    # A flaky bisect's probe of a noisy cell: this one launch (its REPRO_REPEAT), an
    # observation for the bisect's posterior, not a verdict from repeated launches.
    only_launch: int | None = None


# ---- the pipeline ---------------------------------------------------------------------------


def run_cells(
    repro: Repro,
    cells: Iterable[Cell],
    backend: Backend,
    store: RecordStore,
    settings: Settings,
    options: RunOptions = RunOptions(),
    on_start: Callable[[list[Cell]], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
    on_phase: phases.OnPhase | None = None,
) -> list[Record]:
    """Run cells in order on `backend`, sharing launches where the repro allows it
    ([launch] batch), and save one record per cell in `store`; `on_phase` hears each phase
    (resolving, installing, launching, running, judging) as it begins (run/phases.py).

    Every cell that ran ends with a saved record; an interrupt keeps the records already
    written, marks the cells it interrupted, and leaves no folder for cells never started."""
    with phases.reporting(on_phase):
        return _run_cells(repro, cells, backend, store, settings, options, on_start, on_record)


def _run_cells(
    repro: Repro,
    cells: Iterable[Cell],
    backend: Backend,
    store: RecordStore,
    settings: Settings,
    options: RunOptions,
    on_start: Callable[[list[Cell]], None] | None,
    on_record: Callable[[Record], None] | None,
) -> list[Record]:
    pending = [_new_pending(repro, cell, store, options) for cell in cells]
    records: list[Record] = []
    try:
        for item in pending:
            _prepare(repro, item, backend, settings, options)
            if item.open:
                _preflight(repro, item, backend, options, settings)
        ready = [item for item in pending if item.open]
        groups = _groups(repro, ready)
        noisy = [g for g in groups if repeat_loop.declared(repro, g[0].cell.variant)]
        groups = [g for g in groups if g not in noisy]
        many = capabilities.many(backend) if len(groups) > 1 else None
        threads = capabilities.concurrent(backend) if options.workers > 1 else None
        if many is not None:
            _launch_many(repro, groups, many, options, records, on_start, on_record)
        elif threads is not None and len(groups) > 1:
            _launch_concurrently(repro, groups, threads, options, records, on_start, on_record)
        else:
            for group in groups:
                if on_start is not None:
                    on_start([item.cell for item in group])
                _launch_group(repro, group, backend, options)
                finish(group, records, on_record)
        for group in noisy:  # repeated launches, one cell at a time (run/repeat_loop.py)
            if on_start is not None:
                on_start([item.cell for item in group])
            _launch_group(repro, group, backend, options)
            finish(group, records, on_record)
        finish([item for item in pending if item not in ready], records, on_record)
    finally:
        for item in pending:
            remove_if_empty(item.run_dir)
    order = {id(item.record): index for index, item in enumerate(pending)}
    return sorted(records, key=lambda r: order[id(r)])


def _launch_concurrently(
    repro: Repro,
    groups: list[list[Pending]],
    backend: LaunchesConcurrently,
    options: RunOptions,
    records: list[Record],
    on_start: Callable[[list[Cell]], None] | None,
    on_record: Callable[[Record], None] | None,
) -> None:
    """`options.workers` launches at once (each its own run folder, port and process group,
    on a back end that runs each launch apart: `concurrent`). A launch's failure is its
    cells' records, as in order; an interrupt stops every launch (`cancel_all`), waits for
    them to save their records, then propagates."""
    lock = threading.Lock()

    def one(group: list[Pending]) -> list[Pending]:
        if on_start is not None:
            with lock:
                on_start([item.cell for item in group])
        _launch_group(repro, group, backend, options)
        return group

    with ThreadPoolExecutor(max_workers=options.workers, thread_name_prefix="launch") as pool:
        running = {pool.submit(phases.in_context(one), group) for group in groups}
        try:
            while running:
                done, running = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    finish(future.result(), records, on_record)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                backend.cancel_all()
            for future in running:
                future.exception()  # wait: the interrupted launches save their records
            raise


def _launch_many(
    repro: Repro,
    groups: list[list[Pending]],
    backend: LaunchesMany,
    options: RunOptions,
    records: list[Record],
    on_start: Callable[[list[Cell]], None] | None,
    on_record: Callable[[Record], None] | None,
) -> None:
    """Every launch handed to the back end at once (`LaunchesMany`: a Slurm array job), at
    most `options.workers` running; each is judged and recorded as it ends, not when the
    slowest does. A failed submission is the record of every launch not yet ended; an
    interrupt stops them all (closing the back end's iterator) and keeps what was saved."""
    requests = [_begin(repro, group, backend, options) for group in groups]
    if on_start is not None:
        for group in groups:
            on_start([item.cell for item in group])
    everyone = [item.cell.label for group in groups for item in group]
    phases.emit(phases.PhaseKind.LAUNCHING, f"{len(groups)} launches submitted", everyone)
    waiting = {index: group for index, group in enumerate(groups)}
    left: list[Pending] = [item for group in groups for item in group]
    launches = [(_prepared(g), request) for g, request in zip(groups, requests, strict=True)]
    with recording(left):  # a failed submission, or an interrupt: every launch not ended
        with closing(backend.launch_many(launches, options.workers)) as ended:
            for index, outcome in ended:
                group = waiting.pop(index)
                for item in group:
                    left.remove(item)
                with recording(group):
                    if isinstance(outcome, ReproboxError):
                        raise outcome
                    phases.emit(phases.PhaseKind.JUDGING, cells=[i.cell.label for i in group])
                    judge_launch(repro, group, requests[index], outcome)
                finish(group, records, on_record)
    for group in waiting.values():  # the submission failed: their records say why
        finish(group, records, on_record)


def _prepared(group: list[Pending]) -> Prepared:
    assert group[0].prepared is not None
    return group[0].prepared


def _new_pending(repro: Repro, cell: Cell, store: RecordStore, options: RunOptions) -> Pending:
    run_dir = store.new_run_dir(repro.name, cell.slug, options.results_base)
    record = Record.for_cell(cell, run_dir)
    record.code_hash, record.script_args = resume.code_hash(repro, cell), script_args(repro, cell)
    return Pending(cell, record, run_dir)


def _prepare(
    repro: Repro, item: Pending, backend: Backend, settings: Settings, options: RunOptions
) -> None:
    with recording([item]), phases.for_cells([item.cell.label]):
        started = time.monotonic()
        phases.emit(phases.PhaseKind.RESOLVING, "the lock")
        _, item.record.commits = resolve_sources(dict(item.cell.packages), settings)
        lock = options.lock or lock_for(
            repro, item.cell.variant, item.cell.platform, dict(item.cell.packages),
            settings=settings,
        )  # fmt: skip
        item.record.lock = str(lock)
        phases.emit(phases.PhaseKind.PREPARING, f"the {backend.name} environment")
        try:
            item.prepared = backend.prepare(repro, item.cell, lock)
        except CannotTestHere as exc:  # e.g. too few GPUs, found before installing
            cannot_test(repro, item, str(exc), exc.by)
            return
        item.record.lock_hash = item.prepared.lock_hash
        item.record.runner = item.prepared.runner
        item.record.image = item.prepared.image
        item.record.torch_source = item.prepared.torch_source
        item.record.env_s = time.monotonic() - started


def _request(
    repro: Repro,
    group: list[Pending],
    options: RunOptions,
    preflight: tuple[str, ...] | None = None,
) -> LaunchRequest:
    lead = group[0]
    launch = repro.launch(lead.cell.variant)
    if preflight is not None or len(group) == 1:
        timeout = options.timeout or launch.timeout
    else:
        timeout = options.timeout or sum(repro.launch(i.cell.variant).timeout for i in group)
    cases = tuple(
        Case(item.cell, tuple(script_args(repro, item.cell)), item.run_dir) for item in group
    )
    return LaunchRequest(repro, launch, cases, timeout, preflight, options.echo)


def _preflight(
    repro: Repro, item: Pending, backend: Backend, options: RunOptions, settings: Settings
) -> None:
    """Ask the script, in one plain process, whether this environment can be tested at all.

    Some combinations break the launcher itself before any rank starts (e.g. one that cannot
    import deepspeed): no rank would be left to say "cannot test". With [launch] preflight,
    the script runs once with those extra arguments through the same launch machinery
    (process group, clean-up, the run's timeout); 0 means go on, 125 means cannot test (with
    its result written as usual), anything else is an error.

    With the host's torch (REPROBOX_TORCH_SOURCE=host) the harness first checks its version
    against the repro's range (`_host_torch`)."""
    if settings.torch_source == "host" and item.prepared is not None:
        with recording([item]):
            _host_torch(repro, item)
        if not item.open:
            return
    preflight = repro.launch(item.cell.variant).preflight
    if not preflight or item.prepared is None:
        return
    request = _request(repro, [item], options, tuple(preflight))
    with recording([item]), phases.for_cells([item.cell.label]):
        phases.emit(phases.PhaseKind.LAUNCHING, "preflight check")
        launched = backend.launch(item.prepared, request)
        item.record.preflight_s = launched.wall_s
        code = launched.launcher_code
        log = f"the preflight log in {launched.logs}"
        if launched.timed_out:
            raise ReproboxError(
                f"preflight timed out after {request.timeout:g}s; see {log}",
                exit_code=ExitCode.TIMEOUT,
            )
        if code == 0:
            request.lead.result.unlink(missing_ok=True)
            return
        if code != Verdict.CANNOT_TEST.exit_code:
            why = f"; last error: {launched.last_error}" if launched.last_error else ""
            raise ReproboxError(f"preflight exited {code}{why}; see {log}")
        item.record.command = backend.command(item.prepared, request)
        item.record.apply(
            judge_case(repro, request.lead, launched, [Verdict.CANNOT_TEST]), launched
        )


def _host_torch(repro: Repro, item: Pending) -> None:
    """Record the host's torch the cell's environment imports, and end the cell cannot-test
    (through the judge, like a script's own preflight) when `host_check` finds it unfit."""
    assert item.prepared is not None
    item.record.host_torch, problem = host_check.check(repro, item.cell.platform, item.prepared)
    if problem is not None:
        cannot_test(repro, item, f"cannot test here: {problem}", host_check.HOST_RESULT_BY)


def _launch_group(
    repro: Repro, group: list[Pending], backend: Backend, options: RunOptions
) -> None:
    """One launch for the group: a single cell gets its arguments on the command line; a
    batch gets a plan file (see repros/README.md, "Batching")."""
    request = _begin(repro, group, backend, options)
    with recording(group), phases.for_cells([item.cell.label for item in group]):
        lead = group[0]
        assert lead.prepared is not None
        if repeat_loop.declared(repro, lead.cell.variant):
            repeat_loop.run(
                repro, lead.record, lead.prepared, request, backend, options.workers, judge_case,
                options.only_launch,
            )  # fmt: skip
            return
        processes = request.launch.processes
        phases.emit(phases.PhaseKind.LAUNCHING, f"{processes} process{'es' * (processes != 1)}")
        launched = backend.launch(lead.prepared, request)
        phases.emit(phases.PhaseKind.JUDGING)
        judge_launch(repro, group, request, launched)


def _begin(
    repro: Repro, group: list[Pending], backend: Backend, options: RunOptions
) -> LaunchRequest:
    """The group's request, its command in the records, and each record saved as stopped
    mid-launch (what stays if the harness is killed before the launch ends)."""
    lead = group[0]
    assert lead.prepared is not None
    request = _request(repro, group, options)
    command = backend.command(lead.prepared, request)
    names = backend.env_names(lead.prepared, request)  # never their values
    found = machine.capture(
        machine.launch_variables(names, os.environ, request.launch.env), _lock_text(lead)
    )
    found.update(lead.prepared.machine)  # what the back end knows better (a container's)
    if lead.prepared.image:
        found["image"] = lead.prepared.image
    for item in group:
        item.record.command = command
        item.record.env_names = list(names)
        item.record.machine = dict(found)
        if item is not lead:
            item.record.batch_dir = str(lead.run_dir)
    for item in group:  # if the harness itself is killed (-9) mid-launch, this says so
        item.record.reason = STOPPED_MID_LAUNCH
        item.record.exit_code = int(ExitCode.HARNESS_FAILED)
        save(item.record)
        item.record.reason, item.record.exit_code = "", 0
    return request


def _lock_text(item: Pending) -> str:
    try:
        return Path(item.record.lock).read_text() if item.record.lock else ""
    except OSError:
        return ""


def launch_key(repro: Repro, item: Pending) -> Hashable:
    """Cells with equal keys can share one launch."""
    spec = repro.launch(item.cell.variant)
    env = item.prepared.key if item.prepared else None
    return (
        env,
        spec.launcher,
        spec.processes,
        spec.config,
        tuple(spec.args),
        tuple(sorted(spec.env.items())),
    )


def _groups(repro: Repro, pending: list[Pending]) -> list[list[Pending]]:
    if not repro.spec.launch.batch:
        return [[item] for item in pending]
    groups: dict[Hashable, list[Pending]] = {}
    for item in pending:
        alone = repeat_loop.declared(
            repro, item.cell.variant
        )  # a noisy cell's launches are its own
        groups.setdefault(id(item) if alone else launch_key(repro, item), []).append(item)
    return list(groups.values())
