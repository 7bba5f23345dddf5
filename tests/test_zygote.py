"""The python launcher's warm start (run.zygote) through the real launcher: the named modules
are imported once and the ranks forked from that interpreter; each rank's status is still
its own, a failed rank's peers are still stopped after the grace, and a hang still leaves
nothing behind. A cold launch of the same script is the control."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from reprobox.run import launcher
from reprobox.run.exits import rank_exits

SCRIPT = """\
import atexit, os, signal, sys, time
import probe_mod  # imported again: in a warm rank it is already there
atexit.register(lambda: open(os.environ["PROBE_LOG"] + ".atexit", "a").write("ran\\n"))
rank = int(os.environ["RANK"])
print("rank", rank, "of", os.environ["WORLD_SIZE"], "parent", os.getppid(), "pid", os.getpid(),
      "name", __name__,
      "argv", sys.argv[1:], "path0", sys.path[0], flush=True)
mode = sys.argv[1]
if mode == "segv" and rank == 1:
    os.kill(os.getpid(), signal.SIGSEGV)
if mode == "exit3" and rank == 1:
    sys.exit(3)
if mode in ("exit3", "hang"):
    time.sleep(600)  # stuck, as a peer in a collective is
sys.exit(0)
"""


def _plan(
    tmp_path: Path, mode: str, fork: tuple[str, ...], timeout: float = 60
) -> launcher.LaunchPlan:
    folder = tmp_path / "repro"
    folder.mkdir(exist_ok=True)
    (folder / "probe.py").write_text(SCRIPT)
    (folder / "probe_mod.py").write_text(
        'import os\nopen(os.environ["PROBE_LOG"], "a").write("%d\\n" % os.getpid())\n'
    )
    return launcher.LaunchPlan(
        launcher="python", bin_dir=Path(sys.executable).parent, processes=2,
        script=folder / "probe.py", script_args=[mode], timeout=timeout,
        log_dir=tmp_path / "run", cwd=tmp_path, env={"PROBE_LOG": str(tmp_path / "imports")},
        port=launcher.free_port(), fork=fork,
    )  # fmt: skip


def _ranks(plan: launcher.LaunchPlan) -> list[str]:
    return [(plan.log_dir / f"rank{r}.log").read_text() for r in range(plan.processes)]


@pytest.mark.parametrize("fork", [("probe_mod",), ()], ids=["warm", "cold"])
def test_warm_ranks_import_once_and_run_as_a_cold_start_does(tmp_path: Path, fork: tuple) -> None:
    plan = _plan(tmp_path, "ok", fork)
    outcome = launcher.run(plan)
    assert outcome.returncode == 0 and outcome.codes == (0, 0)
    imports = (tmp_path / "imports").read_text().split()
    assert len(imports) == (1 if fork else 2)
    logs = _ranks(plan)
    for rank, text in enumerate(logs):
        assert f"rank {rank} of 2" in text
        assert "name __main__" in text and "argv ['ok']" in text
        assert f"path0 {plan.script.parent}" in text
    parents = {re.search(r"parent (\d+)", text).group(1) for text in logs}  # type: ignore[union-attr]
    if fork:  # both forked from the interpreter that imported the module, not the harness
        assert parents == set(imports) and str(os.getpid()) not in parents
    else:
        assert parents == {str(os.getpid())}
    assert not (plan.log_dir / ".rank-codes.json").exists()
    # each rank ends as a cold one does: its atexit handlers run
    assert (tmp_path / "imports.atexit").read_text().split() == ["ran", "ran"]


def test_a_warm_rank_killed_by_a_signal_is_named_with_it(tmp_path: Path) -> None:
    outcome = launcher.run(_plan(tmp_path, "segv", ("probe_mod",)))
    assert outcome.codes == (0, -11)
    assert rank_exits(outcome.codes)[1].code == -11
    assert outcome.returncode == -11


def test_a_warm_ranks_failure_stops_its_stuck_peer_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "PEER_GRACE_S", 1.0)
    outcome = launcher.run(_plan(tmp_path, "exit3", ("probe_mod",)))
    assert outcome.codes == (-15, 3)  # the peer got SIGTERM; rank 1's own code wins
    assert outcome.returncode == 3
    assert outcome.wall_s < 30


def test_a_hung_warm_launch_is_killed_whole_at_its_timeout(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "hang", ("probe_mod",), timeout=3)
    outcome = launcher.run(plan)
    assert outcome.timed_out and outcome.returncode is None
    pids = [int(m) for m in (tmp_path / "imports").read_text().split()]
    for text in _ranks(plan):
        pids += [int(found) for found in re.findall(r"(?:parent|pid) (\d+)", text)]
    assert len(set(pids)) == 3  # the zygote and its two ranks
    for pid in set(pids):
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
