"""Start a repro's ranks with the launcher the stack ships, and always clean up after them.

torchrun and `accelerate launch` are used as they are; the plain `python` launcher starts N
processes with the torch.distributed environment (RANK, WORLD_SIZE, MASTER_PORT, ...) itself.
nox has no timeouts, so this module owns them: every process of a launch carries a run id in
its environment, the launch runs in its own process group, and on timeout, Ctrl-C or exit the
group is terminated and any process still carrying the id is killed, so nothing is orphaned.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import psutil

RUN_ID_ENV = "REPROBOX_RUN_ID"
TERM_GRACE_S = 5.0
# When one rank of the plain launcher fails, its peers are usually stuck in a collective.
PEER_GRACE_S = 30.0


def free_port() -> int:
    """A TCP port that is free on loopback now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LaunchPlan:
    """One launch: what to start, where, for how long, and where its logs go."""

    launcher: str  # torchrun | accelerate | python
    bin_dir: Path  # the venv's bin/
    processes: int
    script: Path
    script_args: Sequence[str]
    timeout: float
    log_dir: Path
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    launcher_args: Sequence[str] = ()
    config: Path | None = None
    port: int = 0
    rank_logs: bool = True  # ask the launcher for per-rank logs (see collect_rank_logs)

    def argv(self) -> list[str]:
        """The command line a person would type (also what the report quotes)."""
        script = [str(self.script), *self.script_args]
        if self.launcher == "torchrun":
            # Underscore spellings: the only ones torch < 2.1 understands.
            logs = ["--log_dir", str(self.log_dir / "torchrun"), "--tee", "3"]
            return [
                str(self.bin_dir / "torchrun"),
                *("--nnodes", "1", "--nproc_per_node", str(self.processes)),
                *("--master_addr", "127.0.0.1", "--master_port", str(self.port)),
                *(logs if self.rank_logs else []),
                *self.launcher_args,
                *script,
            ]
        if self.launcher == "accelerate":
            config = ["--config_file", str(self.config)] if self.config else []
            # --tee prefixes each rank's lines ("[default1]:"), so launch.log splits per
            # rank; accelerate < 0.34 has no --log_dir to pass on.
            return [
                str(self.bin_dir / "accelerate"),
                "launch",
                *config,
                *("--num_processes", str(self.processes), "--main_process_port", str(self.port)),
                *(["--tee", "3"] if self.rank_logs else []),
                *self.launcher_args,
                *script,
            ]
        return [str(self.bin_dir / "python"), *self.launcher_args, *script]


@dataclass(frozen=True)
class LaunchOutcome:
    returncode: int | None  # None when killed for a timeout or interrupt
    wall_s: float
    timed_out: bool
    log: Path
    rank_logs: list[Path]
    killed_orphans: int = 0


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a process the harness starts in a repro's venv."""
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    # Let the processes cache bytecode in the (harness-owned) venv: with
    # PYTHONDONTWRITEBYTECODE set, every rank of every launch recompiles torch & co.;
    # compiling whole envs at install instead costs ~10 s per env (too much for probes).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(plan: LaunchPlan, echo: TextIO | None = None) -> LaunchOutcome:
    """Run the launch to completion or timeout; KeyboardInterrupt kills it and propagates."""
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex
    env = child_env({**plan.env, RUN_ID_ENV: run_id})
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(plan.port)
    log = plan.log_dir / "launch.log"
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    timed_out = False
    with log.open("wb") as sink:
        sink.write(f"$ {' '.join(plan.argv())}\n".encode())
        sink.flush()
        try:
            procs = _start(plan, env, sink)
            timed_out = _wait(procs, started + plan.timeout, log, echo)
        except BaseException:
            _terminate(procs)
            raise
        finally:
            if timed_out:
                _terminate(procs)
            orphans = _kill_marked(run_id)
    codes = [p.returncode for p in procs]
    returncode = None if timed_out else _combined_code(codes)
    return LaunchOutcome(
        returncode=returncode,
        wall_s=time.monotonic() - started,
        timed_out=timed_out,
        log=log,
        rank_logs=collect_rank_logs(plan.log_dir),
        killed_orphans=orphans,
    )


def _start(plan: LaunchPlan, env: dict[str, str], sink) -> list[subprocess.Popen[bytes]]:
    argv = plan.argv()
    if plan.launcher != "python" or plan.processes == 1:
        proc = subprocess.Popen(
            argv,
            cwd=plan.cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,  # its own group: Ctrl-C reaches the harness, which cleans up
        )
        return [proc]
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(plan.processes):
        rank_env = {
            **env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(plan.processes),
            "LOCAL_WORLD_SIZE": str(plan.processes),
        }
        out = (plan.log_dir / f"rank{rank}.log").open("wb")
        group = procs[0].pid if procs else 0  # one group for all ranks, led by rank 0
        procs.append(
            subprocess.Popen(
                argv,
                cwd=plan.cwd,
                env=rank_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=group,
            )
        )
        out.close()
    return procs


def _wait(procs: list[subprocess.Popen[bytes]], deadline: float, log: Path, echo) -> bool:
    """Poll until every process exits; True when the deadline passed first."""
    echoed = 0
    first_failure: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if echo is not None:
            echoed = _echo_new(log, echoed, echo)
        if all(code is not None for code in codes):
            return False
        now = time.monotonic()
        if now > deadline:
            return True
        if first_failure is None and any(code not in (None, 0, 1, 125) for code in codes):
            first_failure = now
        if first_failure is not None and now - first_failure > PEER_GRACE_S:
            _terminate(procs)
            return False
        time.sleep(0.05)


def _echo_new(log: Path, offset: int, echo: TextIO) -> int:
    with log.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    if chunk:
        echo.write(chunk.decode(errors="replace"))
        echo.flush()
    return offset + len(chunk)


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the launch's process group, then SIGKILL whatever is left after a grace."""
    live = [p for p in procs if p.poll() is None]
    if not procs:
        return
    pgid = procs[0].pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in live):
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_marked(run_id: str) -> int:
    """Kill processes that still carry this launch's run id (escaped the process group)."""
    killed = 0
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(RUN_ID_ENV) == run_id:
                proc.kill()
                killed += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return killed


def _combined_code(codes: list[int | None]) -> int | None:
    """Rank 0's code, unless a rank failed outside the protocol; a rank's own failure code
    wins over the signal that the harness then sent its peers."""
    if not codes:
        return None
    odd = [c for c in codes if c not in (0, 1, 125)]
    own = [c for c in odd if c is not None and c > 0]
    return (own or odd or codes)[0]


def collect_rank_logs(log_dir: Path) -> list[Path]:
    """Per-rank logs as rank<N>.log in the launch's log dir, whatever the launcher wrote:
    torchrun's --log_dir tree, else the "[default<N>]:" prefixes --tee puts in launch.log."""
    tree = log_dir / "torchrun"
    if tree.is_dir():
        for rank_dir in sorted(tree.glob("*/attempt_*/*")):
            if rank_dir.is_dir() and rank_dir.name.isdigit():
                with (log_dir / f"rank{rank_dir.name}.log").open("wb") as out:
                    for stream in ("stdout.log", "stderr.log"):
                        if (rank_dir / stream).is_file():
                            out.write((rank_dir / stream).read_bytes())
        shutil.rmtree(tree, ignore_errors=True)
    elif not list(log_dir.glob("rank*.log")) and (log_dir / "launch.log").is_file():
        ranks: dict[str, list[str]] = {}
        for line in (log_dir / "launch.log").read_text(errors="replace").splitlines():
            if match := _RANK_PREFIX.match(line):
                ranks.setdefault(match.group(1), []).append(line[match.end() :])
        for rank, lines in ranks.items():
            (log_dir / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    return sorted(log_dir.glob("rank*.log"))


_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:")
