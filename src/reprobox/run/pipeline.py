"""The one pipeline behind every run: cell -> lock -> environment -> preflight -> launch ->
judge -> record, on any back end (a venv, a container engine, a cluster).

Each step can fail with a `ReproboxError`; the failure becomes the cell's record (status
`error`, a plain reason, the exit code it implies) and the next cell still runs. Only an
interrupt (Ctrl-C, SIGTERM, SIGHUP) stops the pipeline, after saving the records of the
cells it interrupted. What was measured is never deleted.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, cast

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from reprobox.core.cells import Cell, is_source, script_args
from reprobox.core.errors import BadInput, CannotTestHere, ExitCode, ReproboxError
from reprobox.core.files import atomic_write
from reprobox.core.judge import Judgement, Launched, Status, judge, peek_verdict
from reprobox.core.protocol import SCHEMA_VERSION, Verdict
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro, merge_pins
from reprobox.envs import git, locks, venvs
from reprobox.envs.torch_source import HostTorch
from reprobox.run import repeats
from reprobox.run.backend import Backend, Case, LaunchesMany, LaunchRequest, Prepared

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


# ---- locks and environments (what every back end installs) ---------------------------------


def lock_path(repro: Repro, variant: str, platform: str) -> Path:
    """The committed lock of a variant (what the image installs, too)."""
    return repro.dir / "locks" / f"{variant}.{platform}.txt"


def lock_request(
    repro: Repro, variant: str, platform: str = "cpu", overrides: dict[str, str] | None = None
) -> locks.LockRequest:
    """What a variant's lock is made from. An override is a version (`name==v`) or a built
    wheel (`name @ file:///...whl`, see `resolve_sources`)."""
    versions = {k: v for k, v in (overrides or {}).items() if not is_source(v)}
    wheels = [f"{k} @ {v}" for k, v in (overrides or {}).items() if is_source(v)]
    return locks.LockRequest(
        requirements=tuple(merge_pins(repro.requirements(variant, platform, versions), wheels)),
        python=repro.python(platform),
        platform=platform,
        exclude_newer=repro.spec.env.exclude_newer,
    )


def lock_for(
    repro: Repro,
    variant: str,
    platform: str = "cpu",
    overrides: dict[str, str] | None = None,
    *,
    settings: Settings,
) -> Path:
    """The committed lock when the variant runs at its own pins (in the CPU build of torch),
    else a cached one (also the pypi flavour of torch, REPROBOX_TORCH_SOURCE=pypi)."""
    if settings.torch_source == "host":
        host_range(repro, platform)  # none stated: bad input, before anything is installed
    overrides, _ = resolve_sources(overrides, settings)
    request = lock_request(repro, variant, platform, overrides)
    committed = lock_path(repro, variant, platform)
    own_pins = not overrides and settings.torch_source != "pypi"
    if own_pins and committed.is_file():
        shown = str(committed.relative_to(repro.dir.parent.parent))
        if locks.lock_input_hash(committed) != request.input_hash:
            raise BadInput(
                f"{shown} is stale: repro.toml changed "
                f"since it was generated; run `nox -s lock -- {repro.name}`"
            )
        locks.check_body(committed, shown)  # edited with its header kept: integrity error
        return committed
    return locks.cached_lock(request, settings)


def host_range(repro: Repro, platform: str) -> SpecifierSet:
    """The host torch versions the repro accepts on `platform` ([platforms.NAME] host_torch),
    which REPROBOX_TORCH_SOURCE=host needs: a repro that states none was never said to work
    with any torch but its own (bad input, exit 2)."""
    wanted = repro.platform(platform).host_torch_range
    if wanted is None:
        raise BadInput(
            f"REPROBOX_TORCH_SOURCE=host: {repro.name} states no host_torch range for platform "
            f'{platform} (add host_torch = ">=X.Y" under [platforms.{platform}] in repro.toml)'
        )
    return wanted


def resolve_sources(
    overrides: dict[str, str] | None, settings: Settings
) -> tuple[dict[str, str], dict[str, str]]:
    """Overrides with each git ref or checkout replaced by the wheel built from it, and
    package -> the commit that wheel holds (what the record names). A branch resolves once
    per process, a sha never moves; a ref that does not exist is bad input (exit 2), a
    commit that does not build an environment failure (exit 3)."""
    resolved: dict[str, str] = {}
    commits: dict[str, str] = {}
    for package, value in (overrides or {}).items():
        if not is_source(value) or value.endswith(".whl"):
            resolved[package] = value
            continue
        source = git.resolve_source(package, value, settings)
        resolved[package] = source.requirement.split(" @ ", 1)[1]
        commits[package] = source.commit
    return resolved, commits


def env_inputs(repro: Repro, platform: str) -> tuple[str, dict[str, str], list[str]]:
    """What besides the lock makes an environment: python, install env, late source builds."""
    return repro.python(platform), repro.install_env(platform), repro.spec.env.no_build_isolation


def ensure_env(repro: Repro, lock: Path, platform: str, *, settings: Settings) -> venvs.Env:
    """The repro's environment for `lock` on `platform`, created if needed."""
    host_packages = list(repro.platform(platform).host_package_ranges)
    return venvs.ensure_env(
        lock, *env_inputs(repro, platform), settings=settings, host_packages=host_packages
    )


# ---- the pipeline ---------------------------------------------------------------------------


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
        code = int(getattr(exc, "exit_code", ExitCode.INTERRUPTED))
        for item in pending:
            if item.record.status == Status.ERROR.value and item.record.verdict is None:
                item.record.reason, item.record.exit_code = "interrupted", code
            _save(item.record)
        raise


def run_cells(
    repro: Repro,
    cells: Iterable[Cell],
    backend: Backend,
    store: RecordStore,
    settings: Settings,
    options: RunOptions = RunOptions(),
    on_start: Callable[[list[Cell]], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Run cells in order on `backend`, sharing launches where the repro allows it
    ([launch] batch), and save one record per cell in `store`.

    Every cell that ran ends with a saved record; an interrupt keeps the records already
    written, marks the cells it interrupted, and leaves no folder for cells never started."""
    pending = [_new_pending(repro, cell, store, options) for cell in cells]
    records: list[Record] = []
    try:
        for item in pending:
            _prepare(repro, item, backend, settings, options)
            if item.open:
                _preflight(repro, item, backend, options, settings)
        ready = [item for item in pending if item.open]
        groups = _groups(repro, ready)
        noisy = [g for g in groups if repeats.declared(repro, g[0].cell.variant)]
        groups = [g for g in groups if g not in noisy]
        if len(groups) > 1 and hasattr(backend, "launch_many"):
            _launch_many(repro, groups, backend, options, records, on_start, on_record)
        elif options.workers > 1 and len(groups) > 1 and getattr(backend, "concurrent", False):
            _launch_concurrently(repro, groups, backend, options, records, on_start, on_record)
        else:
            for group in groups:
                if on_start is not None:
                    on_start([item.cell for item in group])
                _launch_group(repro, group, backend, options)
                _finish(group, records, on_record)
        for group in noisy:  # repeated launches, one cell at a time (run/repeats.py)
            if on_start is not None:
                on_start([item.cell for item in group])
            _launch_group(repro, group, backend, options)
            _finish(group, records, on_record)
        _finish([item for item in pending if item not in ready], records, on_record)
    finally:
        for item in pending:
            _remove_if_empty(item.run_dir)
    order = {id(item.record): index for index, item in enumerate(pending)}
    return sorted(records, key=lambda r: order[id(r)])


def _launch_concurrently(
    repro: Repro,
    groups: list[list[Pending]],
    backend: Backend,
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
        running = {pool.submit(one, group) for group in groups}
        try:
            while running:
                done, running = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    _finish(future.result(), records, on_record)
        except BaseException as exc:
            cancel = getattr(backend, "cancel_all", None)
            if isinstance(exc, KeyboardInterrupt) and cancel is not None:
                cancel()
            for future in running:
                future.exception()  # wait: the interrupted launches save their records
            raise


def _launch_many(
    repro: Repro,
    groups: list[list[Pending]],
    backend: Backend,
    options: RunOptions,
    records: list[Record],
    on_start: Callable[[list[Cell]], None] | None,
    on_record: Callable[[Record], None] | None,
) -> None:
    """Every launch handed to the back end at once (`LaunchesMany`: a Slurm array job), at
    most `options.workers` running; each is judged and recorded as it ends, not when the
    slowest does. A failed submission is the record of every launch not yet ended; an
    interrupt stops them all (closing the back end's iterator) and keeps what was saved."""
    many = cast(LaunchesMany, backend)
    requests = [_begin(repro, group, backend, options) for group in groups]
    if on_start is not None:
        for group in groups:
            on_start([item.cell for item in group])
    waiting = {index: group for index, group in enumerate(groups)}
    left: list[Pending] = [item for group in groups for item in group]
    launches = [(_prepared(g), request) for g, request in zip(groups, requests, strict=True)]
    with recording(left):  # a failed submission, or an interrupt: every launch not ended
        with closing(many.launch_many(launches, options.workers)) as ended:
            for index, outcome in ended:
                group = waiting.pop(index)
                for item in group:
                    left.remove(item)
                with recording(group):
                    if isinstance(outcome, ReproboxError):
                        raise outcome
                    _judge_launch(repro, group, requests[index], outcome)
                _finish(group, records, on_record)
    for group in waiting.values():  # the submission failed: their records say why
        _finish(group, records, on_record)


def _prepared(group: list[Pending]) -> Prepared:
    assert group[0].prepared is not None
    return group[0].prepared


def _new_pending(repro: Repro, cell: Cell, store: RecordStore, options: RunOptions) -> Pending:
    run_dir = store.new_run_dir(repro.name, cell.slug, options.results_base)
    return Pending(cell, Record.for_cell(cell, run_dir), run_dir)


def _prepare(
    repro: Repro, item: Pending, backend: Backend, settings: Settings, options: RunOptions
) -> None:
    with recording([item]):
        started = time.monotonic()
        _, item.record.commits = resolve_sources(dict(item.cell.packages), settings)
        lock = options.lock or lock_for(
            repro, item.cell.variant, item.cell.platform, dict(item.cell.packages),
            settings=settings,
        )  # fmt: skip
        item.record.lock = str(lock)
        try:
            item.prepared = backend.prepare(repro, item.cell, lock)
        except CannotTestHere as exc:  # e.g. too few GPUs, found before installing
            cannot_test(repro, item, str(exc), exc.by)
            return
        item.record.lock_hash = item.prepared.lock_hash
        item.record.runner = item.prepared.runner
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
    with recording([item]):
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


HOST_RESULT_BY = "reprobox: the host's torch, checked before launching"


def _host_torch(repro: Repro, item: Pending) -> None:
    """Record the host's torch the cell's environment imports, and end the cell cannot-test
    (through the judge, like a script's own preflight) when its version is outside the
    repro's `host_torch` range, or a `host_packages` entry is missing or outside its range.
    A development build (`2.6.0a0+git...`, as NGC images ship) counts as its release: a
    range would otherwise refuse every such build silently."""
    assert item.prepared is not None
    platform = item.cell.platform
    wanted = host_range(repro, platform)
    host: HostTorch | None = getattr(item.prepared.handle, "host_torch", None)
    if host is None:
        raise BadInput(
            f"REPROBOX_TORCH_SOURCE=host: the {item.prepared.runner} back end does not run "
            "with the host's torch; use the venv (or slurm) back end"
        )
    item.record.host_torch = host.record(repro.python(platform))
    host_lock = getattr(item.prepared.handle, "host_lock", None)
    if host_lock is not None:  # what was installed: `lock` is what it was derived from
        item.record.host_torch["lock"] = str(host_lock)
    where = f"{repro.name} accepts on platform {platform}"
    problem = _outside("torch", host.version, wanted, where)
    found = {name: version for name, version, _ in host.packages}
    for name, wanted_range in repro.platform(platform).host_package_ranges.items():
        if problem is not None:
            break
        if name in host.missing:
            section = f"[platforms.{platform}] host_packages"
            problem = f"the host has no {name}, which {repro.name}'s {section} takes from it"
        else:
            problem = _outside(name, found[name], wanted_range, where)
    if problem is not None:
        cannot_test(repro, item, f"cannot test here: {problem}", HOST_RESULT_BY)


def _outside(name: str, version: str, wanted: SpecifierSet, where: str) -> str | None:
    """Why the host's `name` `version` is not in `wanted`, or None. A development build
    (`2.6.0a0+git...`) counts as its release."""
    try:
        if wanted.contains(Version(version), prereleases=True):
            return None
        why = f"is outside the range {where}"
    except InvalidVersion:
        why = "is not a version the range can be checked against"
    field = "host_torch" if name == "torch" else f"host_packages.{name}"
    return f"the host's {name} {version} {why} ({field} = {wanted!s})"


def cannot_test(repro: Repro, item: Pending, reason: str, by: str) -> None:
    """End a cell "cannot test here" on the harness's own finding (`by`), through the one
    judge as a script's cannot-test result would: the result names who decided."""
    case = Case(item.cell, tuple(script_args(repro, item.cell)), item.run_dir)
    result = {"schema": SCHEMA_VERSION, "verdict": Verdict.CANNOT_TEST.value, "reason": reason}
    atomic_write(case.result, json.dumps({**result, "metrics": {}, "by": by}))
    launched = Launched(logs=item.run_dir)
    item.record.apply(judge_case(repro, case, launched, [Verdict.CANNOT_TEST]), launched)


def _launch_group(
    repro: Repro, group: list[Pending], backend: Backend, options: RunOptions
) -> None:
    """One launch for the group: a single cell gets its arguments on the command line; a
    batch gets a plan file (see repros/README.md, "Batching")."""
    request = _begin(repro, group, backend, options)
    with recording(group):
        lead = group[0]
        assert lead.prepared is not None
        if repeats.declared(repro, lead.cell.variant):
            repeats.run(
                repro, lead.record, lead.prepared, request, backend, options.workers, judge_case
            )
            return
        _judge_launch(repro, group, request, backend.launch(lead.prepared, request))


def _begin(
    repro: Repro, group: list[Pending], backend: Backend, options: RunOptions
) -> LaunchRequest:
    """The group's request, its command in the records, and each record saved as stopped
    mid-launch (what stays if the harness is killed before the launch ends)."""
    lead = group[0]
    assert lead.prepared is not None
    request = _request(repro, group, options)
    command = backend.command(lead.prepared, request)
    # Which variables the launched processes got (names only): a back end that says.
    names: list[str] = getattr(backend, "env_names", lambda p, r: [])(lead.prepared, request)
    for item in group:
        item.record.command = command
        item.record.env_names = list(names)
        if item is not lead:
            item.record.batch_dir = str(lead.run_dir)
    for item in group:  # if the harness itself is killed (-9) mid-launch, this says so
        item.record.reason = STOPPED_MID_LAUNCH
        item.record.exit_code = int(ExitCode.HARNESS_FAILED)
        _save(item.record)
        item.record.reason, item.record.exit_code = "", 0
    return request


def _judge_launch(
    repro: Repro, group: list[Pending], request: LaunchRequest, launched: Launched
) -> None:
    """Each case of an ended launch through the one judge."""
    verdicts = [peek_verdict(case.result) for case in request.cases]
    known = [v for v in verdicts if v is not None]
    for item, case in zip(group, request.cases, strict=True):
        # A batch's ranks exit with the code of all its cases together.
        together = known if len(group) > 1 and len(known) == len(group) else None
        item.record.apply(judge_case(repro, case, launched, together), launched)


def judge_case(
    repro: Repro, case: Case, launched: Launched, verdicts: list[Verdict] | None
) -> Judgement:
    """The one judge, with the variant's own rule and the cell's expectation."""
    cell = case.cell
    return judge(
        repro.rules(cell.variant), cell.expect, cell.also_ok, case.result, launched, verdicts
    )


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
        alone = repeats.declared(repro, item.cell.variant)  # a noisy cell's launches are its own
        groups.setdefault(id(item) if alone else launch_key(repro, item), []).append(item)
    return list(groups.values())


def _finish(
    group: list[Pending], records: list[Record], on_record: Callable[[Record], None] | None
) -> None:
    for item in group:
        _save(item.record)
        records.append(item.record)
        if on_record is not None:
            on_record(item.record)


def _save(record: Record) -> None:
    """Save a record; a full or read-only results folder is one plain error, and what the
    run wrote (result, logs) stays where it is."""
    try:
        record.save()
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        why = "the disk is full" if full else (exc.strerror or str(exc))
        raise ReproboxError(
            f"cannot save the record of {record.repro} {record.label}: {why}; what was "
            f"measured is kept in {record.dir}",
            exit_code=ExitCode.HARNESS_FAILED,
        ) from None


def _remove_if_empty(run_dir: Path) -> None:
    """Drop the folder of a cell that never started; never one holding anything."""
    for path in (run_dir, run_dir.parent):
        try:
            path.rmdir()
        except OSError:
            return


def plan_text(request: LaunchRequest, result_paths: list[str]) -> str:
    """The batch plan file (repros/README.md, "Batching"), with each case's result path as
    the launched processes see it."""
    cases = [
        {"args": list(case.args), "result": path}
        for case, path in zip(request.cases, result_paths, strict=True)
    ]
    return json.dumps({"cases": cases}, indent=2) + "\n"


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
