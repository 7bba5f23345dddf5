"""The pipeline behind every run: cell -> lock -> environment -> launch -> result -> record.

Each step can fail with a `ReproboxError`; the failure becomes the cell's record (status
`error`, a plain reason, the exit code it implies) and the next cell still runs. Only Ctrl-C
stops the pipeline, after saving the record of the cell it interrupted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reprobox.core import settings
from reprobox.core.cells import Cell
from reprobox.core.errors import BadInput, ExitCode, LaunchError, LaunchTimeout, ReproboxError
from reprobox.core.judge import Status, decide, judge
from reprobox.core.protocol import CACHE_ENV, PLAN_ENV, RESULT_ENV, Verdict, read_result
from reprobox.core.records import RECORD_FILE, Record, new_run_dir
from reprobox.core.spec import Repro
from reprobox.envs import locks, venvs
from reprobox.run import launcher as launch

RESULT_FILE = "result.json"
PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class RunOptions:
    platform: str = "cpu"
    echo: TextIO | None = None  # stream the launcher's output here
    timeout: float | None = None  # overrides [launch] timeout
    lock: Path | None = None  # run against this lock instead (date-bisection probes)
    results_base: Path | None = None  # keep run dirs here instead (bisection probes)


def lock_path(repro: Repro, variant: str, platform: str) -> Path:
    """The committed lock of a variant (what the image installs, too)."""
    return repro.dir / "locks" / f"{variant}.{platform}.txt"


def lock_request(
    repro: Repro, variant: str, platform: str = "cpu", overrides: dict[str, str] | None = None
) -> locks.LockRequest:
    return locks.LockRequest(
        requirements=tuple(repro.requirements(variant, platform, overrides)),
        python=repro.python(platform),
        platform=platform,
        exclude_newer=repro.spec.env.exclude_newer,
    )


def lock_for(
    repro: Repro, variant: str, platform: str = "cpu", overrides: dict[str, str] | None = None
) -> Path:
    """The committed lock when the variant runs at its own pins, else a cached one."""
    request = lock_request(repro, variant, platform, overrides)
    committed = lock_path(repro, variant, platform)
    if not overrides and committed.is_file():
        if locks.lock_input_hash(committed) != request.input_hash:
            raise BadInput(
                f"{committed.relative_to(repro.dir.parent.parent)} is stale: repro.toml changed "
                f"since it was generated; run `nox -s lock -- {repro.name}`"
            )
        return committed
    return locks.cached_lock(request)


def env_inputs(repro: Repro, platform: str) -> tuple[str, dict[str, str], list[str]]:
    """What besides the lock makes an environment: python, install env, late source builds."""
    return repro.python(platform), repro.install_env(platform), repro.spec.env.no_build_isolation


def ensure_env(repro: Repro, lock: Path, platform: str) -> venvs.Env:
    """The repro's environment for `lock` on `platform`, created if needed."""
    return venvs.ensure_env(lock, *env_inputs(repro, platform))


def script_args(repro: Repro, cell: Cell) -> list[str]:
    """The script's arguments, in protocol order (see repros/README.md)."""
    variant = repro.variant(cell.variant)
    args = ["--variant", cell.variant, *variant.args]
    if variant.fix:
        args += ["--fix", variant.fix]
    for name, value in cell.params:
        args += [f"--{name}", value]
    return args


def plan_launch(
    repro: Repro,
    cell: Cell,
    env: venvs.Env,
    run_dir: Path,
    options: RunOptions,
    *,
    args: list[str] | None = None,
    protocol_env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> launch.LaunchPlan:
    """The launch of `cell` (or, with `args`/`protocol_env`, of a batch led by it)."""
    spec = repro.launch(cell.variant)
    path = os.pathsep.join([str(env.path / "bin"), os.environ.get("PATH", "")])
    run_env = {
        CACHE_ENV: os.environ.get(CACHE_ENV)
        or str(settings.cache_dir() / "repro-cache" / repro.name),
        **spec.env,
        **(protocol_env or {RESULT_ENV: str(run_dir / RESULT_FILE)}),
        "PYTHONPATH": str(repro.fixes_dir),
        "PATH": path,
        "VIRTUAL_ENV": str(env.path),
    }
    return launch.LaunchPlan(
        launcher=spec.launcher,
        bin_dir=env.path / "bin",
        processes=spec.processes,
        script=repro.script,
        script_args=script_args(repro, cell) if args is None else args,
        timeout=timeout or options.timeout or spec.timeout,
        log_dir=run_dir,
        cwd=run_dir,
        env=run_env,
        launcher_args=spec.args,
        config=repro.dir / spec.config if spec.config else None,
        port=launch.free_port(),
    )


@dataclass
class Pending:
    """A cell on its way through the pipeline: its record fills in as steps succeed."""

    cell: Cell
    record: Record
    run_dir: Path
    env: venvs.Env | None = None


def new_pending(root: Path, repro: Repro, cell: Cell, options: RunOptions) -> Pending:
    run_dir = new_run_dir(root, repro.name, cell.slug, options.results_base)
    record = Record(
        **cell.identity(),
        status=Status.ERROR.value,
        verdict=None,
        platform=options.platform,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        dir=str(run_dir),
    )
    return Pending(cell, record, run_dir)


@contextmanager
def recording(pending: list[Pending]):
    """Turn a failure of this step into the records of these cells; save them on Ctrl-C."""
    try:
        yield
    except ReproboxError as exc:
        for item in pending:
            item.record.reason, item.record.exit_code = str(exc), int(exc.exit_code)
    except KeyboardInterrupt:
        for item in pending:
            item.record.reason, item.record.exit_code = "interrupted", int(ExitCode.INTERRUPTED)
            item.record.save()
        raise


def _prepare_env(repro: Repro, item: Pending, options: RunOptions) -> None:
    with recording([item]):
        started = time.monotonic()
        lock = options.lock or lock_for(
            repro, item.cell.variant, options.platform, dict(item.cell.packages)
        )
        platform = options.platform
        item.env = ensure_env(repro, lock, platform)
        item.record.lock, item.record.lock_hash = str(lock), item.env.lock_hash
        item.record.env_s = time.monotonic() - started


PREFLIGHT_TIMEOUT_S = 300.0


def _preflight(repro: Repro, item: Pending, options: RunOptions) -> None:
    """Ask the script, in one plain process, whether this environment can be tested at all.

    Some combinations break the launcher itself before any rank starts (e.g. one that cannot
    import deepspeed): no rank would be left to say "cannot test". With [launch] preflight,
    the script runs once with those extra arguments; 0 means go on, 125 means cannot test
    (with its result written as usual), anything else is an error."""
    preflight = repro.launch(item.cell.variant).preflight
    if not preflight or item.env is None:
        return
    plan = plan_launch(repro, item.cell, item.env, item.run_dir, options)
    argv = [str(item.env.bin("python")), str(repro.script), *plan.script_args, *preflight]
    env = launch.child_env(plan.env)
    with recording([item]):
        started = time.monotonic()
        try:
            done = subprocess.run(argv, env=env, cwd=item.run_dir, capture_output=True,
                                  text=True, timeout=PREFLIGHT_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise LaunchTimeout(f"preflight timed out after {PREFLIGHT_TIMEOUT_S:g}s") from None
        item.record.preflight_s = time.monotonic() - started
        (item.run_dir / "preflight.log").write_text(
            f"$ {shlex.join(argv)}\n{done.stdout}{done.stderr}"
        )
        if done.returncode == 0:
            (item.run_dir / RESULT_FILE).unlink(missing_ok=True)
            return
        if done.returncode != Verdict.CANNOT_TEST.exit_code:
            raise LaunchError(
                f"preflight exited {done.returncode}; see {item.run_dir}/preflight.log"
            )
        item.record.command = argv
        outcome = launch.LaunchOutcome(125, 0.0, False, item.run_dir / "preflight.log", [])
        judge_result(repro, item, outcome, item.run_dir)


def _launch_group(repro: Repro, group: list[Pending], options: RunOptions) -> None:
    """One launch for the group: a single cell gets its arguments on the command line; a
    batch gets a plan file (see repros/README.md, "Batching")."""
    lead = group[0]
    assert lead.env is not None
    for item in group:
        item.record.command = plan_launch(repro, item.cell, lead.env, item.run_dir, options).argv()
    with recording(group):
        if len(group) == 1:
            plan = plan_launch(repro, lead.cell, lead.env, lead.run_dir, options)
        else:
            plan_file = lead.run_dir / PLAN_FILE
            cases = [
                {"args": script_args(repro, i.cell), "result": str(i.run_dir / RESULT_FILE)}
                for i in group
            ]
            plan_file.write_text(json.dumps({"cases": cases}, indent=2) + "\n")
            timeout = options.timeout or sum(repro.launch(i.cell.variant).timeout for i in group)
            plan = plan_launch(
                repro,
                lead.cell,
                lead.env,
                lead.run_dir,
                options,
                args=[],
                protocol_env={PLAN_ENV: str(plan_file)},
                timeout=timeout,
            )
        outcome = launch.run(plan, echo=options.echo)
        for item in group:
            item.record.wall_s, item.record.returncode = outcome.wall_s, outcome.returncode
            if item is not lead:
                item.record.batch_dir = str(lead.run_dir)
        if outcome.timed_out:
            raise LaunchTimeout(
                f"timed out after {plan.timeout:g}s (a hung collective?); process tree killed; "
                f"logs in {lead.run_dir}"
            )
    for item in group:
        if item.record.exit_code == 0:
            with recording([item]):
                judge_result(repro, item, outcome, lead.run_dir)


def judge_result(repro: Repro, item: Pending, outcome: launch.LaunchOutcome, logs: Path) -> None:
    try:
        result = read_result(item.run_dir / RESULT_FILE)
    except LaunchError as exc:
        raise LaunchError(
            f"{exc}; launcher exit {outcome.returncode}{_last_error(outcome)}; logs in {logs}"
        ) from None
    rules = repro.rules(item.cell.variant)
    verdict, fired = decide(Verdict(result["verdict"]), result["metrics"], rules)
    record = item.record
    record.result, record.metrics = result, result["metrics"]
    record.decided_by = list(dict.fromkeys(rule.metric for rule in rules))
    record.verdict = verdict.value
    record.status = judge(verdict, item.cell.expect, item.cell.also_ok).value
    record.reason = result.get("reason") or fired
    if record.status == Status.MISMATCH.value:
        record.exit_code = int(ExitCode.FAILED)


def _launch_key(repro: Repro, item: Pending) -> tuple:
    """Cells with equal keys can share one launch."""
    spec = repro.launch(item.cell.variant)
    env = item.env.path if item.env else None
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
    groups: dict[tuple, list[Pending]] = {}
    for item in pending:
        groups.setdefault(_launch_key(repro, item), []).append(item)
    return list(groups.values())


def run_cell(root: Path, repro: Repro, cell: Cell, options: RunOptions = RunOptions()) -> Record:
    """Run one cell on its own and save its record, whatever happens."""
    return run_cells(root, repro, [cell], options)[0]


def run_cells(
    root: Path,
    repro: Repro,
    cells: Iterable[Cell],
    options: RunOptions = RunOptions(),
    on_start: Callable[[list[Cell]], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Run cells in order, sharing launches where the repro allows it ([launch] batch).

    Every cell that ran ends with a saved record; Ctrl-C keeps the records already written,
    marks the cells it interrupted, and leaves no directory for cells that never started."""
    pending = [new_pending(root, repro, cell, options) for cell in cells]
    records = []
    try:
        for item in pending:
            _prepare_env(repro, item, options)
            if item.record.exit_code == 0:
                _preflight(repro, item, options)
        ready = [i for i in pending if i.record.exit_code == 0 and i.record.verdict is None]
        for group in _groups(repro, ready):
            if on_start is not None:
                on_start([item.cell for item in group])
            _launch_group(repro, group, options)
            _finish(group, records, on_record)
        _finish([i for i in pending if i not in ready], records, on_record)
    finally:
        for item in pending:
            if not (item.run_dir / RECORD_FILE).exists():
                shutil.rmtree(item.run_dir, ignore_errors=True)
    order = {id(item.record): index for index, item in enumerate(pending)}
    return sorted(records, key=lambda r: order[id(r)])


def _finish(group: list[Pending], records: list[Record], on_record) -> None:
    for item in group:
        item.record.save()
        records.append(item.record)
        if on_record is not None:
            on_record(item.record)


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(Error|Exception|Interrupt)\b.*)")


def _last_error(outcome: launch.LaunchOutcome) -> str:
    """The last exception line any rank printed, to make a crash's one-line reason useful."""
    found = ""
    for log in [outcome.log, *outcome.rank_logs]:
        for line in log.read_text(errors="replace").splitlines():
            match = _ERROR_LINE.search(line)
            if match and "ChildFailedError" not in line:
                found = match.group(1).strip()[:200]
    return f"; last error: {found}" if found else ""


def exit_code(records: Iterable[Record]) -> ExitCode:
    """First error's code; else FAILED when any verdict missed its expectation; else OK."""
    records = list(records)
    for record in records:
        if record.status == Status.ERROR.value:
            return ExitCode(record.exit_code)
    if any(r.status == Status.MISMATCH.value for r in records):
        return ExitCode.FAILED
    return ExitCode.OK
