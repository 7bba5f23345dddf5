"""The phases as a person and a CI log see them (cli/progress.py), with the pipeline's own
phase events (run/phases.py): the live line names the phase; off a terminal each phase is a
line, and a phase that lasts gets a "still ..." line after the heartbeat interval."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from reprobox.cli import ui
from reprobox.cli.progress import CellProgress
from reprobox.core.cells import Cell
from reprobox.core.settings import Settings
from reprobox.run import phases
from reprobox.run.phases import Phase, PhaseKind


def test_the_live_line_names_the_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    terminal = Console(file=buffer, force_terminal=True, width=120, stderr=True, emoji=False)
    monkeypatch.setattr(ui, "console", terminal)
    monkeypatch.setattr(ui, "interactive", lambda: True)
    with CellProgress("toy", 1) as progress:
        progress.start([Cell("toy", "clean")])
        progress.phase(Phase(PhaseKind.RUNNING, ("clean",), "2 processes started"))
        assert progress._progress is not None
        progress._progress.refresh()
    assert "[1/1] toy clean: running (2 processes started)" in buffer.getvalue()


def test_ci_gets_a_line_per_phase_and_heartbeats(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ui.configure(Settings.from_env({"CI": "true", "REPROBOX_HEARTBEAT_S": "0.2"}))
    try:
        with CellProgress("toy", 1) as progress, phases.reporting(progress.phase):
            with phases.for_cells(["clean"]):
                phases.emit(PhaseKind.INSTALLING, "6 packages")
                time.sleep(0.9)
    finally:
        ui.configure(Settings.from_env({}))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "toy clean: installing 6 packages"
    assert len(lines) >= 3 and all(
        line.startswith("toy clean: still installing 6 packages ... ") and line.endswith(" s")
        for line in lines[1:]
    ), lines


def test_no_callback_no_phases() -> None:
    phases.emit(PhaseKind.JUDGING)  # outside a run: nobody listens, nothing fails
    seen: list[Phase] = []
    with phases.reporting(seen.append), phases.for_cells(["a", "b"]):
        phases.in_context(lambda: phases.emit(PhaseKind.RUNNING, "1 process started"))()
    assert seen == [Phase(PhaseKind.RUNNING, ("a", "b"), "1 process started")]
    assert Phase(PhaseKind.LAUNCHING, (), "preflight check").text() == (
        "launching (preflight check)"
    )


def test_scrubbing_the_logs_is_a_phase_of_its_own(tmp_path: Path) -> None:
    """Scrubbing 8 MiB of kept logs takes about a second: it is said as its own phase, not
    counted as `running` (issue 35)."""
    from reprobox.run.rank_logs import bound_logs

    (tmp_path / "rank0.log").write_text("step 1\n" * 1000)
    (tmp_path / "rank1.log").write_text("token=hf_" + "a1" * 20 + "\n")
    seen: list[Phase] = []
    with phases.reporting(seen.append), phases.for_cells(["clean"]):
        bound_logs(tmp_path)
    assert seen == [Phase(PhaseKind.SCRUBBING, ("clean",), "2 logs (6.9 KiB)")]
    assert seen[0].text() == "scrubbing 2 logs (6.9 KiB)"
    assert "hf_" not in (tmp_path / "rank1.log").read_text()
