"""The environment reports as a comment shows them: no `<fill in>` placeholder from
`transformers env`, no raw warning from `ds_report`. The texts under fixtures/env_reports
are real output, captured once in kl's cached environments (transformers 4.53.2, DeepSpeed
0.19.8, colours included; the venv's folder replaced by /home/user/repro-env)."""

from __future__ import annotations

import venv
from pathlib import Path

from test_report import fake_repro, save_record

from reprobox.report import build as report
from reprobox.report.env_trim import trim_stack_report

CAPTURED = Path(__file__).parent / "fixtures" / "env_reports"


def test_transformers_env_loses_its_placeholders_and_preamble() -> None:
    raw = (CAPTURED / "transformers_env.txt").read_text()
    assert "<fill in>" in raw and "FILL OUT" in raw  # what transformers prints
    text = trim_stack_report("transformers env", raw)
    assert "<fill in>" not in text and "FILL OUT" not in text and "Copy-and-paste" not in text
    assert "in script?" not in text  # the whole line goes, not just the placeholder
    assert text.startswith("- `transformers` version: 4.53.2")
    assert "- DeepSpeed version: 0.19.8" in text


def test_accelerate_env_says_not_found_on_its_line() -> None:
    """accelerate env puts `Not found` on a tab-indented line of its own (trl env a tab
    after the colon): the comment reads `...config: not found`, no tab, no stray line."""
    raw = (CAPTURED / "accelerate_env.txt").read_text()
    assert "- `Accelerate` default config:\n\tNot found" in raw  # what accelerate prints
    text = trim_stack_report("accelerate env", raw)
    assert text.endswith("- `Accelerate` default config: not found") and "\t" not in text
    trl = trim_stack_report("trl env", "- TRL version: 0.19.1\n- Accelerate config: \tnot found\n")
    assert trl == "- TRL version: 0.19.1\n- Accelerate config: not found"


def test_ds_report_is_cut_to_its_table() -> None:
    raw = (CAPTURED / "ds_report.txt").read_text()
    assert "[WARNING]" in raw
    text = trim_stack_report("ds_report", raw)
    assert "WARNING" not in text and "libaio" not in text and "NOTE:" not in text
    assert "op name ................ installed .. compatible" in text
    assert "torch version .................... 2.13.0+cpu" in text
    assert "--------------------------------------------------\n-----" not in text


def _environment_with_reports(root: Path) -> Path:
    """A real venv (no pip) holding transformers' and DeepSpeed's metadata and their
    commands, which print the captured output; returns the launcher's path."""
    env = root / "envs" / "captured"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = next((env / "lib").glob("python3*/site-packages"))
    for name, version in (("transformers", "4.53.2"), ("deepspeed", "0.19.8")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for command, captured in (("transformers", "transformers_env"), ("ds_report", "ds_report")):
        script = env / "bin" / command
        script.write_text(
            f"import sys\nsys.stdout.write(open({str(CAPTURED / captured)!r}+'.txt').read())\n"
        )
    launcher = env / "bin" / "accelerate"
    launcher.write_text("")
    return launcher


def test_the_comment_carries_the_trimmed_reports(scratch_root: Path) -> None:
    """Through `write_report`: the commands run with the recorded environment's python."""
    fake_repro(scratch_root)
    launcher = _environment_with_reports(scratch_root)
    for variant, verdict in (("broken", "reproduced"), ("fixed", "clean")):
        save_record(scratch_root, variant, verdict, command=[str(launcher), "launch", "ppo.py"])
    made = report.write_report(scratch_root, "ppo", report.ReportOptions(env_timeout=60))
    comment = made.comment.read_text()
    assert "<summary><code>transformers env</code></summary>" in comment
    assert "<summary><code>ds_report</code></summary>" in comment
    assert "- `transformers` version: 4.53.2" in comment
    assert "cpu_adam ............... [NO] ....... [OKAY]" in comment
    for raw in ("<fill in>", "&lt;fill in&gt;", "FILL OUT", "[WARNING]", "libaio", "\x1b["):
        assert raw not in comment, raw
