"""A launch in a process of its own: the plan as JSON, `python -m
reprobox.run.backends.detached PLAN OUTCOME` runs it with the launcher (sessions, rank
logs, watchdog, timeout, clean-up) and writes how it ended as JSON beside the logs.

Why a process: while a launch runs, the launcher owns process-wide state (the harness is a
child subreaper, and orphans re-parented to it are killed when the launch ends), so two
launches in one process would reap each other's ranks. K concurrent launches (`--workers K`)
therefore each run in a runner process of their own, with their own port, sessions,
run folder and environment. The Slurm back end runs the same command as its batch script,
on the node: one launch path, wherever it runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal

from reprobox.core.cells import Cell
from reprobox.core.errors import ExitCode, LaunchError, ReproboxError, interrupt_code
from reprobox.core.files import atomic_write
from reprobox.core.judge import Launched
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.run import interrupts, launcher, multinode
from reprobox.run.backend import LaunchRequest, Prepared
from reprobox.run.backends.venv import VenvBackend
from reprobox.run.exits import last_error, launcher_exits, rank_exits

PLAN_NAME = "launch-plan.json"
OUTCOME_NAME = "launch-outcome.json"
STOP_GRACE_S = 20.0  # a runner told to stop kills its ranks within launcher.TERM_GRACE_S
# LaunchPlan's Path fields (JSON holds them as strings)
_PATH_FIELDS = ("bin_dir", "script", "log_dir", "cwd", "config", "registry")


def write_plan(plan: launcher.LaunchPlan, path: Path) -> None:
    """The plan as JSON (paths as strings), for a runner process to read."""
    data = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(plan).items()}
    data["script_args"], data["launcher_args"] = list(plan.script_args), list(plan.launcher_args)
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def read_plan(path: Path) -> launcher.LaunchPlan:
    data = json.loads(path.read_text())
    for key in _PATH_FIELDS:
        if data.get(key) is not None:
            data[key] = Path(data[key])
    data["fork"] = tuple(data.get("fork", ()))  # JSON holds it as a list
    return launcher.LaunchPlan(**data)


def runner_argv(plan_file: Path, outcome_file: Path, echo: bool = False) -> list[str]:
    """The command that runs one plan: this interpreter, so the node (for Slurm) uses the
    very harness that wrote the plan (it must be on a path the nodes share)."""
    tail = ["--echo"] if echo else []
    return [sys.executable, "-m", __name__, str(plan_file), str(outcome_file), *tail]


def run_plan_file(plan_file: Path, outcome_file: Path, echo: bool = False) -> int:
    """Run one plan to its end and write its outcome; the exit status says how the runner
    itself ended (0: the outcome says how the launch did; 130/143: interrupted)."""
    started = time.time()
    data: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": started}
    code = 0
    with interrupts.handled():
        try:
            plan = read_plan(plan_file)
            # A port free where the launch runs (a node is not the machine that planned it);
            # a launch over nodes comes with the port its first node chose for all of them.
            if plan.nodes == 1:
                plan = replace(plan, port=launcher.free_port())
            data["port"] = plan.port
            outcome = launcher.run(plan, echo=sys.stdout if echo else None)
            data.update(
                returncode=outcome.returncode,
                codes=list(outcome.codes),
                wall_s=outcome.wall_s,
                timed_out=outcome.timed_out,
                log=str(outcome.log),
                rank_logs=[str(p) for p in outcome.rank_logs],
            )
        except KeyboardInterrupt as exc:
            code = int(interrupt_code(exc))
            data["interrupted"] = code
        except ReproboxError as exc:
            code = int(exc.exit_code)
            data.update(error=str(exc), exit_code=code)
        except (OSError, ValueError, TypeError) as exc:
            code = int(ExitCode.HARNESS_FAILED)
            data.update(error=f"cannot run {plan_file}: {exc}", exit_code=code)
        data["ended_at"] = time.time()
        with interrupts.shielded(raise_pending=False):
            atomic_write(outcome_file, json.dumps(data, indent=2) + "\n")
    return code


def read_outcome(path: Path) -> dict[str, Any] | None:
    """What a runner wrote, or None when it wrote nothing readable (killed before the end)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def launched(plan: launcher.LaunchPlan, data: dict[str, Any], logs: Path) -> Launched:
    """A runner's outcome as the judge reads it (the same reading as the venv back end's)."""
    if "error" in data:
        raise ReproboxError(str(data["error"]), exit_code=ExitCode(int(data["exit_code"])))
    if "interrupted" in data:
        raise interrupts.interrupt_for(
            signal.SIGTERM if data["interrupted"] == ExitCode.TERMINATED else signal.SIGINT
        )
    log = Path(data["log"])
    rank_logs = [Path(p) for p in data.get("rank_logs", [])]
    timed_out = bool(data["timed_out"])
    harness_ranks = multinode.harness_ranks(plan.launcher, plan.processes, plan.nodes)
    if harness_ranks:
        exits = rank_exits(data["codes"])
    else:
        exits = launcher_exits(data["returncode"], log)
    return Launched(
        exits=() if timed_out else exits,
        timed_out=timed_out,
        timeout=plan.timeout,
        wall_s=float(data["wall_s"]),
        logs=logs,
        last_error=last_error([log, *rank_logs]),
        launcher_stops_peers=not harness_ranks,
    )


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the runner, before it starts: SIGTERM when the harness dies (it then stops its
    launch as for any SIGTERM), so a killed harness leaves no launch behind."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class DetachedBackend:
    """The venv back end with each launch in a runner process: safe to launch from several
    threads at once (`--workers K`). `cancel_all` stops every launch still running."""

    name = "venv"
    concurrent: Literal[True] = True

    def __init__(self, settings: Settings) -> None:
        self.venv = VenvBackend(settings)
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        return self.venv.prepare(repro, cell, lock)

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The variables the launched processes start with (names only, for the record)."""
        return self.venv.env_names(prepared, request)

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return self.venv.command(prepared, request)

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        if self._stopping.is_set():
            raise KeyboardInterrupt
        plan = self.venv.plan(prepared, request)
        plan.log_dir.mkdir(parents=True, exist_ok=True)
        plan_file, outcome_file = plan.log_dir / PLAN_NAME, plan.log_dir / OUTCOME_NAME
        outcome_file.unlink(missing_ok=True)
        write_plan(plan, plan_file)
        echo = request.echo is not None
        with (plan.log_dir / "runner.log").open("wb") as sink:
            try:
                proc = subprocess.Popen(
                    runner_argv(plan_file, outcome_file, echo),
                    stdout=None if echo else sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start the launch runner: {exc.strerror}") from None
            with self._lock:
                self._live.add(proc)
            try:
                self._wait(proc)
            except KeyboardInterrupt:
                with interrupts.shielded(raise_pending=False):
                    _stop(proc)
                raise
            finally:
                with self._lock:
                    self._live.discard(proc)
        data = read_outcome(outcome_file)
        if data is None:
            raise LaunchError(
                f"the launch runner exited {proc.returncode} without an outcome; see "
                f"{plan.log_dir / 'runner.log'}"
            )
        return launched(plan, data, request.lead.run_dir)

    def _wait(self, proc: subprocess.Popen[bytes]) -> None:
        told = False
        while True:
            try:
                proc.wait(timeout=0.2)
                return
            except subprocess.TimeoutExpired:
                pass
            if self._stopping.is_set() and not told:
                _signal(proc, signal.SIGTERM)  # it stops its launch and writes its outcome
                told = True

    def cancel_all(self) -> None:
        """Stop every launch this back end runs (an interrupt reached the harness)."""
        self._stopping.set()
        with self._lock:
            live = list(self._live)
        for proc in live:
            _signal(proc, signal.SIGTERM)


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except (ProcessLookupError, OSError):
        pass


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the runner (it kills its ranks), SIGKILL it if it takes too long."""
    _signal(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or (len(args) == 3 and args[2] != "--echo"):
        print("usage: python -m reprobox.run.backends.detached PLAN OUTCOME [--echo]")
        return int(ExitCode.BAD_INPUT)
    return run_plan_file(Path(args[0]), Path(args[1]), echo=len(args) == 3)


if __name__ == "__main__":
    sys.exit(main())
