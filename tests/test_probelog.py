"""The probe log: resumption, torn lines, and refusing another bisect's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprobox.bisect.log import ProbeLog
from reprobox.core.errors import BadInput

HEADER = {"kind": "release", "repro": "kl", "package": "trl", "good": "0.7.2", "bad": "0.4.7"}


def test_entries_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    log = ProbeLog(path, HEADER)
    log.add({"key": "0.5.0#1", "item": "0.5.0", "attempt": 1, "verdict": "reproduced"})
    again = ProbeLog(path, HEADER)
    assert again.get("0.5.0#1")["verdict"] == "reproduced"
    assert again.get("0.6.0#1") is None


def test_a_line_torn_by_kill_9_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    log = ProbeLog(path, HEADER)
    log.add({"key": "0.5.0#1", "item": "0.5.0", "attempt": 1, "verdict": "clean"})
    with path.open("a") as handle:
        handle.write('{"key": "0.6.0#1", "verd')
    again = ProbeLog(path, HEADER)
    assert set(again.entries) == {"0.5.0#1"}


def test_another_bisects_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "probes.jsonl"
    ProbeLog(path, HEADER)
    with pytest.raises(BadInput, match=r"belongs to another bisect \(differs in: good\)"):
        ProbeLog(path, {**HEADER, "good": "0.7.3"})
    path.write_text("hello\n")
    with pytest.raises(BadInput, match="not a reprobox bisect log"):
        ProbeLog(path, HEADER)
