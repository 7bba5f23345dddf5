"""What a person sees, drawn by `cli.ui`: the progress line, the verdict table in each format,
and record or repro.toml text that is printed as written, never read as rich markup."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from reprobox.cli import columns, table_drawing, ui
from reprobox.cli.progress import CellProgress
from reprobox.core.cells import Cell
from reprobox.core.records import Record
from reprobox.core.settings import Settings

LABEL = "broken[transformers=4.44.2]"
REASON = "rank 1 exited 1; see [/tmp/results/rank1.log] :warning: [bold]"


def _record(label: str, verdict: str | None, **fields: object) -> Record:
    values: dict = {
        "repro": "lm_head",
        "variant": label.split("[", 1)[0],
        "label": label,
        "packages": {},
        "params": {},
        "expect": "reproduced",
        "also_ok": [],
        "status": "match" if verdict else "error",
        "verdict": verdict,
        "metrics": {"gap": 0.5} if verdict else {},
        "decided_by": ["gap"] if verdict else [],
        "wall_s": 3.25,
    }
    values.update(fields)
    return Record(**values)


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """`ui.out` drawn into a buffer, as a terminal 60 columns wide would show it."""
    buffer = io.StringIO()
    monkeypatch.setattr(
        ui, "out", Console(file=buffer, width=60, highlight=False, emoji=False, color_system=None)
    )
    return buffer


# ---- progress


def test_progress_line_keeps_what_finished_apart_from_the_cell_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CI", "true")  # plain lines, as in a CI log
    cells = [Cell("lm_head", "broken"), Cell("lm_head", "untied"), Cell("lm_head", "fixed")]
    with CellProgress("lm_head", 4) as progress:
        progress.start([cells[0]])
        progress.done(_record("broken", "reproduced"))
        progress.start([cells[1]])
        progress.done(_record("untied", "clean", expect="clean"))
        progress.start([cells[2]])
        progress.done(_record("fixed", None, reason="rank 0 crashed"))
        progress.start([Cell("lm_head", "broken", packages=(("transformers", "4.44.2"),))])
    starts = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert starts == [
        "[1/4] lm_head broken ...",
        "[2/4] lm_head untied ...  (done: 1 reproduced)",
        "[3/4] lm_head fixed ...  (done: 1 clean, 1 reproduced)",
        f"[4/4] lm_head {LABEL} ...  (done: 1 clean, 1 reproduced, 1 error)",
    ]


def test_progress_of_a_shared_launch_names_every_cell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CI", "true")
    with CellProgress("toy", 2) as progress:
        progress.start([Cell("toy", "clean"), Cell("toy", "reproduced")])
    assert capsys.readouterr().err.splitlines() == [
        "[1-2/2] toy clean, reproduced (one launch) ..."
    ]


def test_live_progress_keeps_brackets_of_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    terminal = Console(file=buffer, force_terminal=True, width=120, stderr=True, emoji=False)
    monkeypatch.setattr(ui, "console", terminal)
    monkeypatch.setattr(ui, "interactive", lambda: True)
    with CellProgress("lm_head", 1) as progress:
        progress.start([Cell("lm_head", "broken", packages=(("transformers", "4.44.2"),))])
        assert progress._progress is not None
        progress._progress.refresh()
        progress.done(_record(LABEL, "reproduced"))
    assert f"lm_head {LABEL} ..." in buffer.getvalue()


# ---- the verdict table


def test_rich_table_prints_record_text_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    wide = Console(file=buffer, width=200, force_terminal=True, color_system=None, emoji=False)
    monkeypatch.setattr(ui, "out", wide)
    table_drawing.verdict_table(
        [_record(LABEL, "reproduced"), _record("fixed", None, reason=REASON)], "rich"
    )
    text = buffer.getvalue()
    assert "┃ repro" in text  # drawn by rich
    assert LABEL in text  # the version is kept
    assert REASON in text  # a closing-tag look-alike neither crashes nor vanishes; no emoji


def test_plain_table_never_splits_a_word(screen: io.StringIO) -> None:
    records = [_record(LABEL, "reproduced"), _record("fixed", None, reason=REASON)]
    table_drawing.verdict_table(records, "plain")
    lines = screen.getvalue().splitlines()
    assert lines[0] == "reprobox verdicts" and len(lines) == 5
    assert any(LABEL in line and "gap=0.5" in line for line in lines)
    assert any(REASON in line for line in lines)  # whole, though wider than the 60 columns
    assert lines[-1].endswith("3.2")  # wall s, right-aligned
    starts = {line.index("reproduced") for line in lines[3:4]}
    assert starts == {lines[1].index("expected")}  # columns line up


def test_auto_is_plain_off_a_terminal(screen: io.StringIO) -> None:
    table_drawing.verdict_table(
        [_record(LABEL, "reproduced")]
    )  # existing calls: format defaults to auto
    assert screen.getvalue().startswith("reprobox verdicts\nrepro ")


def test_auto_is_rich_at_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui, "out", Console(file=io.StringIO(), force_terminal=True))
    monkeypatch.setattr(ui, "_ci", False)
    ui.configure(Settings.from_env({}))
    assert table_drawing.table_format("auto") == "rich"
    ui.configure(Settings.from_env({"CI": "true"}))  # a CI log is read later, in any width
    assert table_drawing.table_format("auto") == "plain"
    with pytest.raises(ValueError, match="unknown table format 'html'"):
        table_drawing.table_format("html")


def test_markdown_table_escapes_pipes_and_lines_up() -> None:
    text = columns.markdown_table(["cell", "wall s"], [["a|b", "1.0"], ["multi\nline", "12.5"]])
    assert text.splitlines() == [
        "| cell       | wall s |",
        "| ---------- | -----: |",
        "| a\\|b       |    1.0 |",
        "| multi line |   12.5 |",
    ]


# ---- listing


def test_repro_list_does_not_read_titles_as_markup(screen: io.StringIO) -> None:
    rows = [
        {
            "repro": "lm_head",
            "title": "lm_head [/x] is wrong at [bold]bf16[/bold] :warning:",
            "upstream": "https://example.invalid/[1]",
            "variants": {
                "broken": {"expect": "reproduced", "default": True, "description": "[red]"}
            },
        }
    ]
    ui.repro_list(rows)
    assert screen.getvalue().splitlines() == [
        "lm_head: lm_head [/x] is wrong at [bold]bf16[/bold] :warning:",
        "  upstream: https://example.invalid/[1]",
        "  - broken: expect reproduced  [red]",
    ]


# ---- layering


def test_ui_imports_only_core() -> None:
    """ui draws; it must not pull in environments, launchers or the report (rich and core
    only), so any command can print without importing what it does not run."""
    probe = (
        "import sys, reprobox.cli.ui\n"
        "mods = sorted(m for m in sys.modules if m.startswith('reprobox.'))\n"
        "print('\\n'.join(mods))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = done.stdout.split()
    assert "reprobox.cli.ui" in loaded
    outside = [m for m in loaded if not m.startswith(("reprobox.core", "reprobox.cli"))]
    assert outside == []
    # and of the CLI only the text tables it lays out (pure text, no console)
    cli = [m for m in loaded if m.startswith("reprobox.cli.")]
    assert cli == ["reprobox.cli.columns", "reprobox.cli.ui"]


def test_a_cell_that_could_not_be_tested_is_not_called_a_mismatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(ui, "console", Console(file=buffer, width=200, color_system=None))
    ui.record_line(_record("broken", "cannot_test", status="mismatch", reason="too few GPUs"))
    ui.record_line(_record("fixed", "clean", status="mismatch"))
    first, second = buffer.getvalue().splitlines()
    assert "CANNOT TEST" in first and "MISMATCH" not in first
    assert "MISMATCH" in second


@pytest.mark.parametrize("width", [80, 100, 120, 160, 200])
def test_a_result_line_at_a_terminal_never_splits_a_word(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """At a terminal the result line is broken between words (a terminal cuts where the
    line meets its edge: `objec|tive/kl`); every word stays whole, no line is wider."""
    buffer = io.StringIO()
    terminal = Console(file=buffer, force_terminal=True, width=width, stderr=True,
                       soft_wrap=True, color_system=None, emoji=False)  # fmt: skip
    monkeypatch.setattr(ui, "console", terminal)
    reason = (
        "max |logp - ref_logp| = 0.125 at step 0; objective/kl per rank = -0.0024 / -0.0040 "
        "over 64 sequences of 24 tokens; reference model dtype torch.float32, policy "
        "torch.bfloat16 under DeepSpeed ZeRO-2 (bf16) with trl 0.7.1 and accelerate 0.34.2"
    )
    record = _record("broken[trl=0.7.1,accelerate=0.34.2]", "reproduced", reason=reason)
    ui.record_line(record)
    lines = buffer.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width, lines
    words = " ".join(lines).split()
    for word in f"{record.repro} {record.label}: {reason}".split():
        assert word in words, (word, lines)
