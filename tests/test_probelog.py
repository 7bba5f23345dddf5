"""The probe log: resumption, torn lines, lines of the wrong shape, refusing another bisect's
log, and one bisect at a time per log (real processes, real SIGKILL)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from filelock import FileLock

from reprobox.bisect.probe_log import LogBusy, ProbeLog
from reprobox.bisect.summary import ProbeEntry
from reprobox.core.errors import BadInput, ExitCode

HEADER = {"kind": "release", "repro": "kl", "package": "trl", "good": "0.7.2", "bad": "0.4.7"}


def entry(item: str, verdict: str | None = "clean", attempt: int = 1) -> ProbeEntry:
    skip = verdict is None
    return ProbeEntry(
        key=f"{item}#{attempt}", item=item, attempt=attempt, verdict=verdict, skip=skip
    )


def test_entries_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    with ProbeLog(path, HEADER) as log:
        log.add(entry("0.5.0", "reproduced"))
        log.add(entry("0.5.1", None))
    with ProbeLog(path, HEADER) as again:
        assert again.get("0.5.0#1").verdict == "reproduced"
        assert again.get("0.5.1#1").skip
        assert again.get("0.6.0#1") is None


def _child(script: str, path: Path) -> subprocess.Popen[str]:
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from reprobox.bisect.probe_log import ProbeLog
        from reprobox.bisect.summary import ProbeEntry
        log = ProbeLog(Path({str(path)!r}), {HEADER!r})
    """) + textwrap.dedent(script)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_line_torn_by_kill_9_is_cut_so_the_next_probe_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    # A real process: one whole probe line, half of the next, then SIGKILL mid-write.
    child = _child(
        """
        log.add(ProbeEntry(key="0.5.0#1", item="0.5.0", verdict="clean"))
        with log.path.open("a") as handle:
            handle.write('{"key": "0.6.0#1", "verd')
            handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        path,
    )
    assert child.wait(timeout=60) == -signal.SIGKILL
    assert not path.read_text().endswith("\n")  # the torn line is there

    with ProbeLog(path, HEADER) as log:  # the dead process's lock is gone with it
        assert set(log.entries) == {"0.5.0#1"}
        log.add(entry("0.6.0", "reproduced"))  # the probe that was torn, measured again
    with ProbeLog(path, HEADER) as again:
        assert set(again.entries) == {"0.5.0#1", "0.6.0#1"}  # nothing glued, nothing lost
    assert all(json.loads(line) for line in path.read_text().splitlines())


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("null", "not a probe entry (null)"),
        ('{"item": "0.6.0", "verdict": "clean"}', "not a probe entry (no key)"),
        ('{"key": "0.6.0#1", "item": "0.6.0", "verdict": "maybe"}', "verdict: Input should be"),
        ('{"key": "0.6.0#1", "item": "0.6.0"}', "either a verdict or skip"),
        ("[1, 2]", "not a probe entry ([1, 2])"),
        ("{not json", "not JSON"),
    ],
)
def test_lines_of_the_wrong_shape_are_refused_naming_file_and_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "probes.jsonl"
    with ProbeLog(path, HEADER) as log:
        log.add(entry("0.5.0"))
    with path.open("a") as handle:
        handle.write(line + "\n")
        handle.write(entry("0.7.0").log_line() + "\n")
    with pytest.raises(BadInput) as caught:
        ProbeLog(path, HEADER)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ") and problem in message, message
    assert "\n" not in message
    with FileLock(f"{path}.lock").acquire(timeout=0.1):  # a refused log leaves no lock held
        pass


def test_another_bisects_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    ProbeLog(path, HEADER).close()
    with pytest.raises(BadInput, match=r"belongs to another bisect \(differs in: good\)"):
        ProbeLog(path, {**HEADER, "good": "0.7.3"})
    path.write_text("hello\n")
    with pytest.raises(BadInput, match="not a reprobox bisect log"):
        ProbeLog(path, HEADER)


def test_a_second_bisect_of_the_same_log_says_who_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    holder = _child('print("held", flush=True)\ntime.sleep(60)\n', path)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(LogBusy) as caught:
            ProbeLog(path, HEADER, lock_wait_s=0.5)
        assert 0.4 < time.monotonic() - started < 10  # it waited, briefly
        assert f"pid {holder.pid}" in str(caught.value)
        assert caught.value.exit_code == ExitCode.BAD_INPUT
        assert len(path.read_text().splitlines()) == 1  # nothing written by the second one
    finally:
        holder.kill()
        holder.wait()
    with ProbeLog(path, HEADER, lock_wait_s=5) as log:  # free again once the holder is gone
        assert log.entries == {}
