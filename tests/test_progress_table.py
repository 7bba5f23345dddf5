"""The verdict table at a terminal's width, through the real `reprobox table` over records on
disk: at 80, 120 and 200 columns (COLUMNS) no line is wider than the terminal and no token
(a long label, a number like 6.89) is split across lines; what was dropped to fit is said in
a footnote line. And the tally line: what was as expected, and what missed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

from reprobox.cli.table_drawing import fit_columns, tally_line, verdict_rows
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record

LABELS = (
    "broken[transformers=4.44.2,model=llama]",
    "fixed[transformers=4.44.2,model=llama]",
    "broken[transformers=5.24.0,model=qwen2]",
)
TOKENS = (*LABELS, "gap=6.89", "gap=0.0012", "gap=0.003")


def _record(label: str, expect: str, verdict: str | None, status: Status, **more: object) -> Record:
    values: dict = {
        "repro": "lm_head", "variant": label.split("[")[0], "label": label, "expect": expect,
        "status": status, "verdict": verdict, "wall_s": 12.25,
        "started_at": "2026-12-02T04:00:00Z",
    }  # fmt: skip
    values.update(more)
    return Record(**values)


def _write(results: Path) -> None:
    gaps = (6.89, 0.0012, 0.003)
    expected = (("reproduced", "reproduced", Status.MATCH), ("clean", "clean", Status.MATCH),
                ("reproduced", "clean", Status.MISMATCH))  # fmt: skip
    for index, (label, gap, (expect, verdict, status)) in enumerate(
        zip(LABELS, gaps, expected, strict=True)
    ):
        folder = results / "lm_head" / f"cpu-cell{index}" / "20261202T040000-abcdef"
        folder.mkdir(parents=True)
        record = _record(label, expect, verdict, status, metrics={"gap": gap},
                         decided_by=["gap"], dir=str(folder),
                         exit_code=int(status == Status.MISMATCH))  # fmt: skip
        record.save()


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_the_table_never_wraps_mid_token(root: Path, tmp_path: Path, columns: int) -> None:
    _write(tmp_path / "results")
    env = {**os.environ, "COLUMNS": str(columns), "REPROBOX_ROOT": str(root),
           "REPROBOX_RESULTS": str(tmp_path / "results")}  # fmt: skip
    env.pop("CI", None)
    done = subprocess.run(
        [sys.executable, "-m", "reprobox", "table", "lm_head", "--format", "rich"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr  # one cell missed its expectation
    assert max(cell_len(line) for line in lines) <= columns, done.stdout
    for token in TOKENS:
        assert any(token in line for line in lines), (token, done.stdout)
    header = next(line for line in lines if "cell" in line and "verdict" in line)
    if columns >= 200:
        assert "measured" in header and "wall s" in header
        assert not any(line.startswith("(dropped") for line in lines), done.stdout
    else:
        footnote = next(line for line in lines if line.startswith("(dropped "))
        assert "measured" in footnote and "measured" not in header, done.stdout
    assert "1 of 3 verdicts as expected" not in done.stdout
    assert any(line.startswith("2 of 3 verdicts as expected; missed:") for line in lines)


def test_fitting_drops_the_least_needed_columns_first() -> None:
    header = ["repro", "cell", "expected", "verdict", "status", "decided by", "measured", "wall s"]
    row = ["lm_head", LABELS[0], "reproduced", "reproduced", "match", "gap=6.89",
           "2026-12-02T04:00:00Z", "12.2"]  # fmt: skip
    keep, widths, footnote = fit_columns(header, [row], 80)
    assert [header[i] for i in keep] == ["cell", "verdict", "status", "decided by"]
    assert sum(widths) + 3 * len(keep) + 1 <= 80
    assert widths[0] == len(LABELS[0])  # a label is never split
    assert footnote.startswith("(dropped measured, wall s, repro, expected to fit 80 columns")
    keep, _, footnote = fit_columns(header, [row], 200)
    assert len(keep) == len(header) and footnote == ""
    keep, _, _ = fit_columns(header, [row, ["other", *row[1:]]], 100, one_repro=False)
    assert "repro" in [header[i] for i in keep]  # two repros: the repro column stays


def test_fitting_cuts_with_an_ellipsis_only_as_a_last_resort() -> None:
    header = ["cell", "verdict", "decided by"]
    keep, widths, footnote = fit_columns(header, [["x" * 90, "clean", "gap=1"]], 80)
    assert keep == [0, 1, 2] and sum(widths) + 10 <= 80
    assert "cell cut with …" in footnote


def test_the_tally_says_what_missed_and_what_it_gave() -> None:
    good = _record("a", "clean", "clean", Status.MATCH)
    assert tally_line([good] * 11) == "11 of 11 verdicts as expected"
    wrong = _record("b", "reproduced", "clean", Status.MISMATCH)
    crashed = _record("c", "clean", None, Status.ERROR, reason="rank 1 exited 1")
    skipped = _record("d", "clean", Verdict.CANNOT_TEST, Status.MISMATCH)
    unknown = _record("e", "unknown", "clean", Status.RECORDED)
    assert tally_line([good, wrong, crashed, skipped, unknown]) == (
        "1 of 4 verdicts as expected; 1 recorded with no expectation; missed: "
        "lm_head b gave clean (expected reproduced), lm_head c gave error (expected clean), "
        "lm_head d gave cannot test (expected clean)"
    )
    assert tally_line([]) == "no verdicts"


def test_cells_of_one_launch_say_they_share_its_time() -> None:
    """A batch's cells carry the launch's wall time and start: the table says "one launch
    of N" beside it instead of showing it as each cell's own."""
    lead = _record("broken", "reproduced", "reproduced", Status.MATCH, dir="/r/a")
    batched = _record("fixed", "clean", "clean", Status.MATCH, dir="/r/b", batch_dir="/r/a")
    alone = _record("untied", "clean", "clean", Status.MATCH, dir="/r/c")
    walls = [row[-1] for row in verdict_rows([lead, batched, alone])]
    assert walls == ["12.2 (one launch of 2)", "12.2 (one launch of 2)", "12.2"]
