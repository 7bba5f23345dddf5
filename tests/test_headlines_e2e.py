"""One Ctrl-C never flips a headline: after a measured run of a cell, a run of the same cell
interrupted by a real SIGINT (to the harness, or Ctrl-C to nox's whole group) is listed with
its time, and `report` and `table` keep the measured verdict (and `table` exits by it, not
130). Through the real CLI and nox, over the toy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import reprobox

pytestmark = pytest.mark.e2e


def _runs(root: Path) -> list[Path]:
    return sorted((root / "results" / "toy").glob("cpu-reproduced/*/"))


NOXFILE = """
    import sys

    import nox


    @nox.session(venv_backend="none")
    def toy(session):
        session.run(sys.executable, "-m", "reprobox", "run", "toy", "--variant", "reproduced",
                    external=True)
"""


def _start(how: str, tmp_path: Path) -> subprocess.Popen[str]:
    if how == "harness":
        argv = [sys.executable, "-m", "reprobox", "run", "toy", "--variant", "reproduced"]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(textwrap.dedent(NOXFILE))
    return subprocess.Popen(
        [sys.executable, "-m", "nox", "-f", str(noxfile), "-s", "toy"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("how", ["harness", "nox"])
def test_an_interrupted_run_does_not_displace_the_measured_verdict(
    toy_root: Path, tmp_path: Path, how: str
) -> None:
    first = reprobox("run", "toy", "--variant", "reproduced")
    assert first.returncode == 0, first.stderr
    # The same cell, now hanging in rank 1 (same label, same environment), then Ctrl-C.
    toml = toy_root / "repros" / "toy" / "repro.toml"
    text = toml.read_text()
    toml.write_text(
        text.replace(
            'args = ["--mode", "reproduced"]\n\n[variants.cannot]',
            'args = ["--mode", "hang"]\nlaunch = { timeout = 300 }\n\n[variants.cannot]',
        )
    )
    harness = _start(how, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(_runs(toy_root)) == 2 and any(_runs(toy_root)[-1].glob("rank*.log")):
                break
            time.sleep(0.2)
        time.sleep(2)
        if how == "harness":
            harness.send_signal(signal.SIGINT)
        else:  # Ctrl-C in a terminal: nox and the harness get SIGINT
            os.killpg(harness.pid, signal.SIGINT)
        _, stderr = harness.communicate(timeout=60)
    finally:
        harness.kill()
    assert harness.returncode == 130, stderr  # nox too: "Session toy interrupted."
    toml.write_text(text)
    newest = json.loads((_runs(toy_root)[-1] / "record.json").read_text())
    assert newest["verdict"] is None and newest["exit_code"] in (130, 143), newest

    table = reprobox("table", "toy", "--format", "plain")
    assert table.returncode == 0, table.stdout + table.stderr
    row = next(line for line in table.stdout.splitlines() if " reproduced " in line)
    assert "reproduced  match" in row, table.stdout
    measured = json.loads((_runs(toy_root)[0] / "record.json").read_text())["started_at"]
    assert measured in row, table.stdout
    assert newest["reason"] in table.stdout and newest["started_at"] in table.stdout, table.stdout

    report = reprobox("report", "toy", "--no-env")
    assert report.returncode == 0, report.stderr
    made = toy_root / "results" / "toy" / "_report"
    comment = (made / "comment.md").read_text()
    headline = comment.split("\n\n")[0]
    assert headline.startswith("**Reproduced**"), comment
    assert "### Not run" not in comment and newest["started_at"] not in comment, comment
    full = (made / "report.md").read_text()  # the interrupt is the reporter's business
    assert full.count("### Not run") <= 1, full
    assert newest["reason"] in full and newest["started_at"] in full, full
