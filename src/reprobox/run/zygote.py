"""The plain `python` launcher's warm start (`[launch] fork = ["torch"]`): one interpreter
imports the named modules once, then forks the ranks, so a launch of N ranks pays
`import torch` (about 2 CPU-seconds) once instead of N times, as torchrun's
`--start_method fork` does.

It runs as a script in the repro's own environment (`python zygote.py ...`), which has no
reprobox: standard library only, and nothing here imports the harness. The harness imports
`combined_code` from it, so the rule for a launch's status is written once. To the harness a
warm launch is one process that starts its ranks (like torchrun): it exits with the
launch's status and leaves each rank's own status in `.rank-codes.json`; each rank's output
goes to `rank{N}.log` in the log folder; when a rank fails outside the protocol, its peers
get `--peer-grace` seconds (they are usually stuck in a collective) before they are killed.
The ranks stay in this process's group, so the harness's signals reach them, and each dies
with it (a parent-death signal)."""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

RANKS_ENV = "REPROBOX_ZYGOTE_RANKS"  # a JSON list: each rank's torch.distributed variables
PROTOCOL_CODES = (0, 1, 125)  # a verdict, a reproduction, cannot-test (repros/README.md)
PR_SET_PDEATHSIG = 1
CODES_FILE = ".rank-codes.json"  # in the log folder: each rank's status, in rank order


def combined_code(codes: list[int | None]) -> int | None:
    """Rank 0's code, unless a rank failed outside the protocol; a rank's own failure code
    wins over the signal that the harness then sent its peers."""
    if not codes:
        return None
    odd = [c for c in codes if c not in PROTOCOL_CODES]
    own = [c for c in odd if c is not None and c > 0]
    return (own or odd or codes)[0]


def _run_rank(script: str, args: list[str], env: dict[str, str], log: int, parent: int) -> int:
    """In the forked child: become rank `env["RANK"]` and run the script as `python script`
    would (its folder first on sys.path, `__main__`), returning its exit status."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the zygote died before the signal was set
        return 128 + int(signal.SIGKILL)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.update(env)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _status(status: int) -> int:
    """A waited status as subprocess reports it: the exit code, or minus the signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _running(pid: int) -> bool:
    """Whether the rank still runs, without reaping it (its status is collected after)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _kill(pids: list[int], grace: float) -> None:
    """SIGTERM the ranks still running, then SIGKILL after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--imports", default="", help="modules to import before forking")
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--peer-grace", type=float, default=30.0)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    ranks = json.loads(os.environ.pop(RANKS_ENV))
    # as `python script` has it: the script's folder first, never this file's (reprobox's own
    # modules, `watchdog.py` among them, would shadow the environment's packages)
    sys.path[0] = os.path.dirname(os.path.abspath(opts.script))
    for name in filter(None, opts.imports.split(",")):
        importlib.import_module(name)  # a failed import fails the launch, as in a rank
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pids: list[int] = []
    for rank, env in enumerate(ranks):
        log = os.open(os.path.join(opts.log_dir, f"rank{rank}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # fmt: skip
        pid = os.fork()
        if pid == 0:  # the rank ends as a cold one does: atexit handlers, threads joined
            sys.exit(_run_rank(opts.script, opts.args, env, log, parent))
        os.close(log)
        pids.append(pid)
    codes: list[int | None] = [None] * len(pids)
    failed_at: float | None = None  # when a rank first failed outside the protocol
    peers_killed = False
    while None in codes:
        pid, status = os.waitpid(-1, 0 if failed_at is None else os.WNOHANG)
        if pid in pids:
            code = codes[pids.index(pid)] = _status(status)
            if code not in PROTOCOL_CODES and failed_at is None:
                failed_at = time.monotonic()
        elif pid == 0:
            time.sleep(0.05)
        if failed_at is not None and not peers_killed:
            if time.monotonic() - failed_at > opts.peer_grace:
                _kill([pids[i] for i, c in enumerate(codes) if c is None], 5.0)
                peers_killed = True  # then their statuses are collected as any
    # each rank's own status for the harness (a rank's signal is named in its verdict)
    out = os.path.join(opts.log_dir, CODES_FILE)
    with open(out + ".tmp", "w") as handle:
        json.dump(codes, handle)
    os.replace(out + ".tmp", out)
    code = combined_code(codes) or 0
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
