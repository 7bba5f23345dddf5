"""The Slurm back end: a launch (a probe, a cell, a batch of cells) is one batch job, and a
run of several launches (a matrix) one array job, each launch one of its tasks.

`prepare` builds the venv as the venv back end does: the nodes run it from the same path,
so the cache (venvs), the results folder (run folders, logs, results) and the harness's
own installation must be on a file system the nodes share. `launch` writes the venv back
end's launch plan and a batch script that runs it with the harness's launcher on the node
(`reprobox.run.backends.detached`: process group, rank logs, the timeout, clean-up), submits
it with `sbatch --parsable`, waits with `scontrol show job` (accounting may be off: no
sacct) while watching the runner's outcome file and heartbeat (`slurmjob`: a node that dies
or a job left "completing" is never a timeout), and reads back how it ended: the runner's
outcome file in the run folder (every rank's exit status), else Slurm's JobState and
ExitCode=a:b. The judge then decides, as for every back end.

`launch_many` (the pipeline's `LaunchesMany` hook) submits several launches at once as one
`sbatch --array=0-(N-1)%K` (K = --workers): task i runs the plan of launch i from that
launch's own run folder (its own port, logs, outcome file and Slurm output, through a link
per task), and is read back, judged and recorded as soon as it ends, as job `JOBID_i`.
One job id cancels them all. Bisects keep one job per probe: they need each answer early.

With `container_image` the job runs in that image through the cluster's own mechanism
(pyxis/enroot: `sbatch --container-image --container-mounts`), the shared paths mounted at
the same paths; a cluster without pyxis is one plain error before anything is built.

The timeout is the launcher's own kill on the node; the job's time limit is that plus a
margin (Slurm counts whole minutes), unless `--time` says otherwise. `--no-requeue`: a job
whose node fails ends NODE_FAIL instead of waiting in the queue for the node to return.
An interrupt (Ctrl-C, SIGTERM) scancels every job this back end submitted, by their shared
job name (a job whose `sbatch` was cut short included), and waits until `squeue` lists none.
A harness killed with -9 cannot: its runners stop once its beat does (`slurmjob`: 45 s).
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from reprobox.core.cells import Cell
from reprobox.core.errors import (
    BadInput,
    EngineError,
    ExitCode,
    LaunchError,
    ReproboxError,
)
from reprobox.core.files import atomic_write
from reprobox.core.judge import Launched
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.run import devices, interrupts, multinode
from reprobox.run.backend import LaunchRequest, Prepared
from reprobox.run.backends import detached, heartbeat, slurm_nodes, slurmjob
from reprobox.run.backends.slurmjob import (
    Task,
    Watch,
    array_script,
    fields,
    read_back,
    task_ids,
)
from reprobox.run.backends.venv import VenvBackend

TOOLS = ("sbatch", "squeue", "scontrol", "scancel")
MARGIN_S = 60.0  # the job's time limit over the launch's timeout: start-up and clean-up
CLIENT_TIMEOUT_S = 60.0  # a Slurm client call that takes longer: slurmctld is not answering
CANCEL_WAIT_S = 60.0  # how long an scancel'ed job may take to leave the queue
ARRAY_DIR = "slurm-array"  # in the first launch's folder: the array's script, a link per task
GONE_AFTER_S = 60.0  # scontrol failing this long (not "no such job"): the controller is lost
PYXIS = "--container-image"  # what `sbatch --help` lists where pyxis is loaded
SYSTEM_PREFIXES = frozenset(Path(p) for p in ("/", "/usr", "/usr/local"))
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


class SlurmError(EngineError):
    """No Slurm client, or a cluster that does not answer (exit 5, as for no engine)."""


NO_PYXIS = (
    "--container-image needs the pyxis plugin (enroot) on the cluster, and this cluster's "
    "sbatch has no --container-image: leave the option out, or ask its admins for pyxis"
)


def check_time(value: str) -> str:
    """A --time value Slurm takes: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]."""
    if not _TIME.match(value):
        raise BadInput(f"--time {value!r} is not a Slurm time limit (minutes, or [D-]HH:MM:SS)")
    return value


def time_limit(timeout: float) -> str:
    """The job's time limit for a launch timeout: timeout + MARGIN_S, whole minutes up."""
    return str(max(1, math.ceil((timeout + MARGIN_S) / 60)))


def limit_seconds(limit: str) -> float:
    """Seconds of a Slurm time limit string (for messages and the harness's own kill)."""
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts
    return float((int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds)


def gres_gpus(gres: str) -> int:
    """The GPUs a `--gres` value asks for (`gpu`, `gpu:2`, `gpu:a100:2`, `gpu:2,shard:1`)."""
    total = 0
    for item in gres.split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu":
            total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def gpus_for(request: LaunchRequest) -> int:
    """The GPUs one launch needs on its node (0 off the GPU platforms)."""
    cell = request.lead.cell
    return devices.gpus_needed(request.repro, cell.variant, cell.platform)


class SlurmBackend:
    """Launches as Slurm batch jobs, from threads too (`--workers K`: K jobs at once), and
    a run of several launches as one array job (`launch_many`)."""

    name = "slurm"
    concurrent: Literal[True] = True

    def __init__(
        self,
        settings: Settings,
        *,
        partition: str | None = None,
        gres: str | None = None,
        time: str | None = None,
        poll_s: float = 0.5,
        container_image: str | None = None,
        container_mounts: str | None = None,
        nodes: int | None = None,
    ) -> None:
        # GPUs are the job's, not this (login) host's: --gres gpu:N gives N, else each job
        # asks for what its launch needs (`_options`).
        self.venv = VenvBackend(settings, gpus=gres_gpus(gres) if gres else sys.maxsize)
        self.settings = settings
        self.partition, self.gres, self.poll_s = partition, gres, poll_s
        if container_mounts and not container_image:
            raise BadInput("--container-mounts goes with --container-image")
        self.container_image, self.container_mounts = container_image, container_mounts
        self.time = check_time(time) if time else None
        self.nodes = nodes  # --nodes N: every launch over N nodes, else [launch] nodes
        self.job_name = f"reprobox-{uuid.uuid4().hex[:10]}"  # every job of this back end
        self._jobs: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._beat = heartbeat.HarnessBeat()  # the runners stop their launch when it stops

    # -- before anything runs ------------------------------------------------------------

    def check(self) -> None:
        """Fail before any probe or cell: the Slurm client tools, a controller that
        answers, and the partition asked for."""
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise SlurmError(
                f"{', '.join(missing)} not found on PATH: --backend slurm needs the Slurm "
                "client commands of a cluster (Debian: slurm-client; a test cluster: "
                "scripts/slurm-cluster.sh)"
            )
        out = self._client(["scontrol", "show", "partition", "-o"], what="list the partitions")
        names = [fields(line).get("PartitionName", "") for line in out.splitlines()]
        names = [n for n in names if n]
        if self.partition is not None and self.partition not in names:
            known = ", ".join(names) or "none"
            raise BadInput(
                f"--partition {self.partition}: no such partition on this cluster "
                f"(partitions: {known})"
            )
        if self.container_image:
            self.shared_paths()  # a harness on the system's Python cannot be mounted
            if PYXIS not in self._client(["sbatch", "--help"], what="list sbatch's options"):
                raise SlurmError(NO_PYXIS)

    # -- the Backend protocol ------------------------------------------------------------

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        launch = repro.launch(cell.variant)
        nodes = self.nodes or launch.nodes
        runner = f"slurm ({multinode.layout(nodes, launch.processes)})" if nodes > 1 else "slurm"
        return replace(self.venv.prepare(repro, cell, lock), runner=runner)

    def nodes_for(self, request: LaunchRequest) -> int:
        """The nodes of one launch: --nodes, else [launch] nodes; a preflight takes one."""
        return 1 if request.preflight is not None else self.nodes or request.launch.nodes

    def options(self, request: LaunchRequest) -> list[str]:
        """sbatch's options for one launch."""
        limit = self.time or time_limit(request.timeout)
        output, chdir = request.log_dir / "slurm-%j.out", request.lead.run_dir
        return self._options(limit, output, chdir, gpus_for(request), self.nodes_for(request))

    def _options(
        self, limit: str, output: Path, chdir: Path, gpus: int = 0, nodes: int = 1
    ) -> list[str]:
        asked = ["--gres", self.gres] if self.gres else ["--gres", f"gpu:{gpus}"] if gpus else []
        return [
            "--parsable",
            *("--job-name", self.job_name),
            *("--output", str(output)),
            *("--chdir", str(chdir)),
            *("--time", limit),
            *(slurm_nodes.sbatch_options(nodes) if nodes > 1 else ["--nodes=1"]),
            "--no-requeue",
            *(["--partition", self.partition] if self.partition else []),
            *asked,
            *self.container_options(),
        ]

    def shared_paths(self) -> list[Path]:
        """What a containerised job needs at the same paths: results, cache, the checkout,
        the harness's installation and the interpreter it and the environments run on
        (outermost folders only). The system's own /usr cannot be one: it would cover the
        image's."""
        base = Path(sys.base_prefix).resolve()
        if base in SYSTEM_PREFIXES:
            raise BadInput(
                f"--container-image: this harness runs on the system's Python ({base}), which "
                "cannot be mounted into an image at the same path; install reprobox with a "
                "Python on the shared file system (e.g. one `uv python install` put there)"
            )
        paths = [self.settings.results, self.settings.cache, self.settings.root,
                 Path(sys.prefix), base]  # fmt: skip
        shared: list[Path] = []
        for path in sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts)):
            if not any(path.is_relative_to(kept) for kept in shared):
                shared.append(path)
        return shared

    def container_options(self) -> list[str]:
        """pyxis's sbatch options: the image, and the paths the job needs mounted at the same
        paths inside it (results, cache, the repros, the harness's own installation and its
        interpreter), then the user's --container-mounts."""
        if not self.container_image:
            return []
        mounts = [f"{p}:{p}" for p in self.shared_paths()]
        if self.container_mounts:
            mounts.append(self.container_mounts)
        return [
            f"--container-image={self.container_image}",
            f"--container-mounts={','.join(mounts)}",
            "--no-container-mount-home",
        ]

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The variables the launched processes start with (names only, for the record)."""
        return self.venv.env_names(prepared, request)

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        inner = shlex.join(self.venv.command(prepared, request))
        return ["sbatch", *self.options(request)[1:], "--wrap", inner]

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        if self._stopping.is_set():
            raise KeyboardInterrupt
        task = self._stage(prepared, request)
        script = task.plan.log_dir / "slurm-job.sh"
        runner = shlex.join(slurmjob.task_argv(task))
        atomic_write(
            script,
            "#!/bin/sh\n# One reprobox launch, run on the node by the harness's own launcher.\n"
            f"exec {runner}\n",
        )
        limit = self.time or time_limit(request.timeout)
        submitted = time.time()
        job = self._submit([*self.options(request), str(script)])
        try:
            final = self._wait(job, task.outcome_file, limit, task.plan.nodes)
        except KeyboardInterrupt:
            with interrupts.shielded(raise_pending=False):
                self._cancel([job])
            raise
        finally:
            self._beat.remove(task.plan.log_dir)
            with self._lock:
                self._jobs.discard(job)
        outcome = read_back(task.plan, request, job, final, limit, {"submitted_at": submitted})
        if isinstance(outcome, ReproboxError):
            raise outcome
        return outcome

    # -- an array job: several launches, one submission -----------------------------------

    def launch_many(
        self, launches: Sequence[tuple[Prepared, LaunchRequest]], workers: int
    ) -> Generator[tuple[int, Launched | ReproboxError], None, None]:
        """All launches as one array job, at most `workers` tasks running at once (`%K`);
        yields each launch's index and how it ended as its task ends. Leaving early (an
        interrupt, the iterator closed) scancels the array and waits for an empty queue."""
        if self._stopping.is_set():
            raise KeyboardInterrupt
        tasks = [self._stage(prepared, request) for prepared, request in launches]
        array_dir = tasks[0].request.log_dir / ARRAY_DIR
        links = array_dir / "tasks"
        links.mkdir(parents=True, exist_ok=True)
        for index, task in enumerate(tasks):
            (links / str(index)).symlink_to(task.request.log_dir, target_is_directory=True)
        script = array_dir / "slurm-job.sh"
        atomic_write(script, array_script(tasks))
        limit = self.time or max((time_limit(t.request.timeout) for t in tasks), key=int)
        output = links / "%a" / "slurm-%A_%a.out"  # each task's own run folder
        throttle = f"%{workers}" if workers < len(tasks) else ""
        gpus = max(gpus_for(t.request) for t in tasks)
        nodes = max(t.plan.nodes for t in tasks)
        argv = [
            *self._options(limit, output, array_dir, gpus, nodes),
            f"--array=0-{len(tasks) - 1}{throttle}",
        ]
        submitted = time.time()
        job = self._submit([*argv, str(script)])
        left = set(range(len(tasks)))
        deadline = limit_seconds(limit) + MARGIN_S
        watches = [Watch(t.outcome_file, deadline, t.plan.nodes) for t in tasks]
        try:
            while left:
                if self._stopping.is_set():
                    raise KeyboardInterrupt
                states = self._array_states(job)
                for index in sorted(left):
                    final = watches[index].check(states.get(index, {"JobState": "GONE"}))
                    if final is None:
                        continue
                    self._give_up(f"{job}_{index}", final)
                    left.discard(index)
                    task = tasks[index]
                    extra = {"array_job": job, "array_task": index, "array_size": len(tasks)}
                    yield index, read_back(
                        task.plan, task.request, f"{job}_{index}", final, limit,
                        {"submitted_at": submitted, **extra},
                    )  # fmt: skip
                if left:
                    time.sleep(self.poll_s)
        finally:
            if left:
                with interrupts.shielded(raise_pending=False):
                    self._cancel([job])
            for task in tasks:
                self._beat.remove(task.plan.log_dir)
            with self._lock:
                self._jobs.discard(job)

    def _stage(self, prepared: Prepared, request: LaunchRequest) -> Task:
        """The launch's plan on disk in its run folder, no outcome left from before."""
        plan = replace(self.venv.plan(prepared, request), nodes=self.nodes_for(request))
        plan.log_dir.mkdir(parents=True, exist_ok=True)
        request.log_dir.mkdir(parents=True, exist_ok=True)  # Slurm's own output (a preflight's)
        task = Task(plan, request, plan.log_dir / detached.PLAN_NAME,
                     plan.log_dir / detached.OUTCOME_NAME)  # fmt: skip
        slurm_nodes.clear(plan.log_dir, plan.nodes)
        detached.write_plan(plan, task.plan_file)
        self._beat.add(plan.log_dir)  # beating before the job can start: see slurmjob
        return task

    def _array_states(self, job: str) -> dict[int, dict[str, str]]:
        """Each task's scontrol fields (a pending range stands for each of its tasks); {}
        once slurmctld no longer knows the job. A failing scontrol is retried for a while:
        a busy controller must not read as every task gone."""
        failing_since = time.monotonic()
        while True:
            proc = self._run(["scontrol", "show", "job", "-o", job])
            if proc.returncode == 0 or "Invalid job id" in proc.stderr:
                break
            if time.monotonic() - failing_since > GONE_AFTER_S:
                why = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
                raise SlurmError(f"cannot read slurm job {job}: {why}")
            time.sleep(self.poll_s)
        states: dict[int, dict[str, str]] = {}
        for line in proc.stdout.splitlines():
            found = fields(line)
            if "JobState" in found:
                for index in task_ids(found.get("ArrayTaskId", "")):
                    states[index] = found
        return states

    # -- submitting, waiting, cancelling -------------------------------------------------

    def _client(self, argv: list[str], *, what: str, check: bool = True) -> str:
        """Run a Slurm client command in its own session (a Ctrl-C at the terminal is the
        harness's to handle: it cancels the jobs, which a killed client could not)."""
        proc = self._run(argv)
        if check and proc.returncode != 0:
            lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            # sbatch ends a rejected option with a "Try sbatch --help" line: the first says why
            said = [line for line in lines if "error" in line or "unrecognized" in line]
            text = (said or lines or [f"exit {proc.returncode}"])[-1 if not said else 0]
            if f"unrecognized option '{PYXIS}" in proc.stderr:
                raise SlurmError(NO_PYXIS)
            if "Unable to contact slurm controller" in proc.stderr:
                raise SlurmError(f"cannot {what}: slurmctld does not answer ({text})")
            raise ReproboxError(f"cannot {what}: {text}", exit_code=ExitCode.RUN_FAILED)
        return proc.stdout

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=CLIENT_TIMEOUT_S,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found on PATH (needed by --backend slurm)") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"{argv[0]} did not answer in {CLIENT_TIMEOUT_S:g}s: is slurmctld running?"
            ) from None
        if proc.returncode < 0 and -proc.returncode in (signal.SIGINT, signal.SIGTERM):
            raise KeyboardInterrupt
        return proc

    def _submit(self, argv: list[str]) -> str:
        out = self._client(["sbatch", *argv], what="submit the job (sbatch)")
        job = out.strip().split(";")[0]
        if not job.isdigit():
            raise LaunchError(f"sbatch answered {out.strip()!r}, not a job id")
        with self._lock:
            self._jobs.add(job)
        return job

    def _state(self, job: str) -> dict[str, str]:
        out = self._client(["scontrol", "show", "job", "-o", job], what="read the job", check=False)
        found = fields(out)
        if "JobState" not in found:  # purged from slurmctld (MinJobAge) or never known
            return {"JobState": "GONE"}
        return found

    def _wait(self, job: str, outcome_file: Path, limit: str, nodes: int) -> dict[str, str]:
        """Poll until the job ends, or until its watch gives up on it (a finished launch
        Slurm has not ended, a lost node, a launch still running well past its time
        limit): the fields to read it back from."""
        watch = Watch(outcome_file, limit_seconds(limit) + MARGIN_S, nodes)
        while True:
            if self._stopping.is_set():
                raise KeyboardInterrupt  # cancel_all: the except of `launch` scancels it
            final = watch.check(self._state(job))
            if final is not None:
                self._give_up(job, final)
                return final
            time.sleep(self.poll_s)

    def _give_up(self, job: str, final: dict[str, str]) -> None:
        """scancel a job the watch gave up on while Slurm still lists it (no wait: a lost
        node's job may stay listed until the node returns)."""
        if final.get("JobState") in slurmjob.ENDED and not final.get("harness_kill"):
            return
        if final.get("JobState") != "GONE":
            self._client(["scancel", job], what="cancel the job", check=False)

    def queued(self) -> list[str]:
        """This back end's jobs that squeue still lists (pending, running or completing)."""
        out = self._client(
            ["squeue", "-h", "--name", self.job_name, "-o", "%i"], what="list the jobs", check=False
        )
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _cancel(self, jobs: list[str]) -> None:
        """scancel `jobs` and every job of this back end's name; wait until squeue lists none."""
        try:
            if jobs:
                self._client(["scancel", *jobs], what="cancel the jobs", check=False)
            self._client(["scancel", "--name", self.job_name], what="cancel the jobs", check=False)
            deadline = time.monotonic() + CANCEL_WAIT_S
            while self.queued() and time.monotonic() < deadline:
                time.sleep(0.2)
        except (ReproboxError, KeyboardInterrupt):
            pass  # best effort inside a clean-up; `reprobox` names what is left

    def cancel_all(self) -> None:
        """Stop everything this back end submitted (an interrupt reached the harness)."""
        self._stopping.set()
        with self._lock:
            jobs = sorted(self._jobs)
        self._cancel(jobs)
