"""One Slurm job's life as the harness sees it: the node side's runner, the submit side's
watch over a job's state, its outcome file and that heartbeat, and how an ended job is read.

Why a heartbeat: slurmctld learns that a node died only after SlurmdTimeout (minutes), and a
node whose slurmd died can leave a finished job "completing" for minutes more. Waiting for
Slurm there turned a clean launch into a false timeout. So the job's runner
(`python -m reprobox.run.backends.slurmjob PLAN OUTCOME HEARTBEAT`, the harness's detached
runner with a beat) rewrites a small file in its run folder every HEARTBEAT_S, in place (a
rename can hide behind NFS's name cache; an open revalidates), and the watch reads it by
content, never by time stamps (the node's clock is not this host's). A job that Slurm still
lists as running is then judged:
- from its outcome file once its launch finished (the runner wrote its return code or its
  own error) and Slurm has not ended the job within OUTCOME_GRACE_S: the launch's answer
  stands, whatever became of the node;
- as a lost node, an error naming the node and never a timeout or a verdict, when its
  heartbeat stopped for LOST_AFTER_S, or never began by the harness's own deadline;
- as a timeout only when the launch is still beating past the job's time limit plus margin.

The beat goes the other way too: the harness rewrites `harness-heartbeat` in each launch's
run folder every HEARTBEAT_S from a thread of its own (`heartbeat.HarnessBeat`), and the
runner stops its launch (as SIGTERM would: its ranks killed, its outcome "interrupted")
once that file has not changed for HARNESS_LOST_AFTER_S. A harness that can clean up
scancels its jobs; one killed with -9 (or the OOM killer, or a lost login node) cannot, and
its job's processes are gone within HARNESS_LOST_AFTER_S + 2 * HEARTBEAT_S + the launcher's
TERM_GRACE_S (45 s) instead of running until the launch's own timeout.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprobox.core.errors import ExitCode, LaunchError, LaunchTimeout, ReproboxError
from reprobox.core.files import atomic_write
from reprobox.core.judge import Launched
from reprobox.run import multinode
from reprobox.run.backend import LaunchRequest
from reprobox.run.backends import detached, heartbeat, slurm_nodes
from reprobox.run.backends.heartbeat import HARNESS_NAME, HEARTBEAT_NAME
from reprobox.run.launcher import LaunchPlan

JOB_FILE = "slurm.json"  # per launch: job id, state, exit code and its timings
LOST_AFTER_S = 30.0  # no beat this long while Slurm says the job runs: its node is lost
OUTCOME_GRACE_S = 10.0  # a finished launch Slurm has not ended this long: read it anyway
STOPPED_GRACE_S = 120.0  # a launch stopped on its node (SIGTERM) Slurm has not explained
ENDED = frozenset(
    {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
     "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"}
)  # fmt: skip
ON_NODE = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING"})
# Ends that Slurm explains better than any outcome (a launch over nodes too).
_SLURM_SAYS = frozenset({"NODE_LOST", "TIMEOUT", "NODE_FAIL", "CANCELLED", "PREEMPTED",
                         "OUT_OF_MEMORY"})  # fmt: skip
LOST = "NODE_LOST"  # the watch's own state for a job whose node stopped answering
_FIELD = re.compile(r"(\S+?)=(\S*)")


def fields(text: str) -> dict[str, str]:
    """`scontrol show -o` output (Key=Value ...) as a dict (values without spaces)."""
    return dict(_FIELD.findall(text))


def task_ids(spec: str) -> list[int]:
    """The task indices of scontrol's ArrayTaskId: `3`, or a pending set `0-3%2`, `1,4-5`."""
    ids: list[int] = []
    for part in spec.split("%", 1)[0].split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            ids.extend(range(int(first), int(last or first) + 1))
    return ids


# -- the node side ---------------------------------------------------------------------------


def runner_argv(plan_file: Path, outcome_file: Path) -> list[str]:
    """The batch script's command: the detached runner with a heartbeat beside its outcome,
    watching the harness's beside its plan."""
    beat = outcome_file.with_name(HEARTBEAT_NAME)
    harness = plan_file.with_name(HARNESS_NAME)
    return [sys.executable, "-m", __name__, str(plan_file), str(outcome_file), str(beat),
            str(harness)]  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One launch of an array job: its plan and where its files are."""

    plan: LaunchPlan
    request: LaunchRequest
    plan_file: Path
    outcome_file: Path


def task_argv(task: Task) -> list[str]:
    """A launch's command in its batch script: the runner, or srun over its nodes."""
    if task.plan.nodes > 1:
        return slurm_nodes.batch_argv(task.plan_file)
    return runner_argv(task.plan_file, task.outcome_file)


def array_script(tasks: Sequence[Task]) -> str:
    """The array's batch script: task i goes to launch i's run folder and runs its plan with
    the harness's own launcher there (its output in that folder too)."""
    lines = [
        "#!/bin/sh",
        "# reprobox: one array job; task N runs the launch plan in its own run folder.",
        'case "$SLURM_ARRAY_TASK_ID" in',
    ]
    for index, task in enumerate(tasks):
        runner = shlex.join(task_argv(task))
        where = shlex.quote(str(task.request.lead.run_dir))
        lines.append(f"  {index}) cd {where} && exec {runner} ;;")
    lines += [
        '  *) echo "reprobox: no launch for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;',
        "esac",
    ]
    return "\n".join(lines) + "\n"


# -- the submit side -------------------------------------------------------------------------


def finished(data: dict[str, Any] | None) -> bool:
    """Whether a runner's outcome says how its launch ended (not merely that it was stopped)."""
    return data is not None and ("returncode" in data or "error" in data)


@dataclass
class Watch:
    """What the harness has seen of one job (or array task) while Slurm says it runs: of
    each of its nodes' runners (one, or N for a launch over nodes: `slurm_nodes`)."""

    outcome_file: Path  # node 0's; node K's is in its node folder
    deadline_s: float  # running this long (the time limit plus a margin): the harness's kill
    nodes: int = 1
    running_since: float | None = None
    beats: dict[int, str] = field(default_factory=dict)
    beat_at: dict[int, float] = field(default_factory=dict)  # when each node's beat changed
    outcome_at: dict[int, float] = field(default_factory=dict)  # when each outcome was seen
    node_list: str = ""  # the job's nodes when first seen running
    srun_at: float | None = None  # when srun's end (a launch over nodes) was first seen

    def check(self, state: dict[str, str], now: float | None = None) -> dict[str, str] | None:
        """None to keep waiting, else the fields to read the job back from: Slurm's end
        state, or its last state with the watch's word (`outcome_first`, `harness_kill`,
        or JobState NODE_LOST with `lost` saying why and NodeList naming the node)."""
        now = time.monotonic() if now is None else now
        name = state.get("JobState", "GONE")
        if name in ENDED or name == "GONE":
            return state
        if name not in ON_NODE:
            return None  # pending, or requeued: nothing runs yet
        if self.running_since is None:
            self.running_since = now
            self.node_list = state.get("NodeList", "")  # whole: it shrinks while completing
        files = slurm_nodes.outcome_files(self.outcome_file.parent, self.nodes)
        waiting: list[int] = []  # nodes whose launch has not said how it ended
        for node, path in enumerate(files):
            beat = heartbeat.read_beat(path.with_name(HEARTBEAT_NAME))
            if beat is not None and beat != self.beats.get(node):
                self.beats[node], self.beat_at[node] = beat, now
            data = detached.read_outcome(path)
            if data is not None:
                self.outcome_at.setdefault(node, now)
            if data is None or not finished(data):
                waiting.append(node)

        def lost(node: int, why: str) -> dict[str, str]:
            where = state.get("NodeList") or "its node"
            if self.nodes > 1:
                named = slurm_nodes.node_name(files[node], "")
                whole = self.node_list or where
                where = named or slurm_nodes.nth_host(whole, node) or f"node {node} of {whole}"
            return {**state, "JobState": LOST, "lost": why, "seen": name, "NodeList": where}

        srun = slurm_nodes.srun_ended(self.outcome_file.parent) if self.nodes > 1 else None
        if srun is not None and waiting:  # every task is gone: those without an outcome died
            self.srun_at = self.srun_at or now
            if now - self.srun_at > OUTCOME_GRACE_S:
                silent = [n for n in waiting if n not in self.beat_at] or waiting
                started = "never started" if silent[0] not in self.beat_at else "ended"
                why = f"its task {started} and wrote no outcome (srun exited {srun})"
                return lost(silent[0], why)
        if not waiting:
            waited = now - max(self.outcome_at.values())
            return {**state, "outcome_first": f"{waited:.0f}"} if waited > OUTCOME_GRACE_S else None
        for node in waiting:
            if node in self.outcome_at:  # stopped there (SIGTERM), and Slurm has not said why
                waited = now - self.outcome_at[node]
                if waited > STOPPED_GRACE_S:
                    why = (
                        f"its launch was stopped there and Slurm has not said why in {waited:.0f}s"
                    )
                    return lost(node, why)
            elif node in self.beat_at and now - self.beat_at[node] > LOST_AFTER_S:
                ago = f"{now - self.beat_at[node]:.0f}s ago"
                silent = [n for n in waiting if n not in self.beat_at and n not in self.outcome_at]
                if silent:  # the cause: a node whose task never started (a stuck rendezvous)
                    why = f"its task never started (no heartbeat); node {node}'s stopped {ago}"
                    return lost(silent[0], why)
                return lost(node, f"its launch's heartbeat stopped {ago}")
        if now - self.running_since > self.deadline_s:
            for node in waiting:
                if node not in self.beat_at and node not in self.outcome_at:
                    why = f"its launch never beat in {now - self.running_since:.0f}s of running"
                    return lost(node, why)
            if any(node not in self.outcome_at for node in waiting):
                return {**state, "JobState": "TIMEOUT", "harness_kill": "1"}
        return None


def read_back(
    plan: LaunchPlan,
    request: LaunchRequest,
    job: str,
    final: dict[str, str],
    limit: str,
    timing: dict[str, Any],
) -> Launched | ReproboxError:
    """An ended job (or one the watch gave up on): its slurm.json, then how it ended (its
    error returned, not raised)."""
    data = detached.read_outcome(plan.log_dir / detached.OUTCOME_NAME)
    timing.update(
        job=job,
        time_limit=limit,
        read_at=time.time(),
        state=final.get("JobState", "unknown"),
        exit_code=final.get("ExitCode", ""),
        node=final.get("NodeList", ""),
        started_at=data.get("started_at") if data else None,
        ended_at=data.get("ended_at") if data else None,
    )
    if plan.nodes > 1:
        files = slurm_nodes.outcome_files(request.lead.run_dir, plan.nodes)
        timing.update(
            layout=multinode.layout(plan.nodes, plan.processes),
            nodes=[slurm_nodes.node_name(f, f"node {k} (no word)") for k, f in enumerate(files)],
            node_logs=[str(f.parent) for f in files],
        )
    for key in ("lost", "seen", "outcome_first", "harness_kill"):
        if key in final:
            timing[key] = final[key]
    atomic_write(plan.log_dir / JOB_FILE, json.dumps(timing, indent=2, sort_keys=True) + "\n")
    try:
        return ended(plan, request, job, final, data, limit)
    except ReproboxError as exc:
        return exc


def ended(
    plan: LaunchPlan,
    request: LaunchRequest,
    job: str,
    final: dict[str, str],
    data: dict[str, Any] | None,
    limit: str,
) -> Launched:
    """How the job ended, for the judge: the launch's own outcome where it finished (also
    on a node Slurm has not heard from since), else what Slurm or the watch said."""
    state = final.get("JobState", "GONE")
    node = final.get("NodeList") or "its node"
    out = request.log_dir / f"slurm-{job}.out"
    where = f"; logs in {request.lead.run_dir} (Slurm's: {out.name})"
    if plan.nodes > 1 and ("outcome_first" in final or state not in _SLURM_SAYS):
        return slurm_nodes.launched(plan, request.lead.run_dir, job, where)
    if "outcome_first" in final and finished(data):
        assert data is not None
        return detached.launched(plan, data, request.lead.run_dir)
    if state == LOST:
        raise LaunchError(
            f"slurm job {job} lost its node {node}: {final.get('lost', 'no word from it')}, "
            f"while Slurm still lists it {final.get('seen', 'running')}; no verdict{where}"
        )
    if state == "TIMEOUT":
        who = "reprobox cancelled it" if final.get("harness_kill") else "Slurm killed it"
        raise LaunchTimeout(
            f"slurm job {job} ran past its time limit ({limit}); {who}{where}",
            exit_code=ExitCode.TIMEOUT,
        )
    if state == "NODE_FAIL":
        raise LaunchError(f"slurm job {job} failed: {node} went down (NODE_FAIL){where}")
    if state in ("CANCELLED", "PREEMPTED"):
        raise LaunchError(f"slurm job {job} was {state.lower()} outside reprobox{where}")
    if state == "OUT_OF_MEMORY":
        raise LaunchError(f"slurm job {job} ran out of memory (OUT_OF_MEMORY){where}")
    if data is None or ("returncode" not in data and "error" not in data and
                        "interrupted" not in data):  # fmt: skip
        code = final.get("ExitCode", "?")
        raise LaunchError(
            f"slurm job {job} ended {state} (ExitCode {code}) before its launch wrote an "
            f"outcome{where}"
        )
    return detached.launched(plan, data, request.lead.run_dir)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4):
        print("usage: python -m reprobox.run.backends.slurmjob PLAN OUTCOME HEARTBEAT [HARNESS]")
        return int(ExitCode.BAD_INPUT)
    harness = Path(args[3]) if len(args) == 4 else None
    return heartbeat.run_with_heartbeat(Path(args[0]), Path(args[1]), Path(args[2]), harness)


if __name__ == "__main__":
    sys.exit(main())
