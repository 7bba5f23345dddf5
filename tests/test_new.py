"""`reprobox new` through the real CLI: the scaffold runs both ways as written, a wrapped
script's crash is an error and never "reproduced", and bad input is one line, exit 2, with
nothing left on disk."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import newest_records, reprobox
from reprobox.core.errors import ExitCode

USER_SCRIPT = """\
import sys
import torch
fixed = "--fixed" in sys.argv
x = torch.tensor([1.0, 2.0, 3.0])
mean = x.sum() / (len(x) if fixed else 1)
assert abs(mean.item() - 2.0) < 1e-6, f"mean is {mean.item()}, not 2.0"
"""


@pytest.mark.e2e
def test_bad_input_is_one_line_and_leaves_nothing(scratch_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "bug.py"
    script.write_text("assert False\n")
    cases = [
        (["new", "Bad-Name"], "repro name 'Bad-Name': lower case letters, digits and _"),
        (["new", "wrapped", "--from", str(script)], "a repro proves itself both ways"),
        (["new", "wrapped", "--from", str(tmp_path / "gone.py"), "--fixed-args=-x"],
         "no such file"),
        (["new", "plain", "--fixed-args=--fixed"], "go with --from"),
        # its script repros/NAME/NAME.py would be imported instead of the module (issue 35)
        *[(["new", name], f"repros/{name}/{name}.py would shadow the module {name}")
          for name in ("torch", "numpy", "json", "transformers", "typing", "sympy")],
        (["new", "mylib", "--pins", "mylib==1.0"], "would shadow the module mylib"),
    ]  # fmt: skip
    for argv, said in cases:
        done = reprobox(*argv)
        assert done.returncode == ExitCode.BAD_INPUT, (argv, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith("reprobox: error: ") and said in line, line
    assert list((scratch_root / "repros").iterdir()) == []
    assert reprobox("new", "once").returncode == 0
    again = reprobox("new", "once")
    assert again.returncode == ExitCode.BAD_INPUT and "exists already" in again.stderr
    listed = reprobox("list", "once")  # what it wrote, the harness loads
    assert listed.returncode == 0 and "broken" in listed.stdout, listed.stderr


@pytest.mark.e2e
def test_the_template_runs_both_ways_as_written(scratch_root: Path) -> None:
    assert reprobox("new", "mean_bug").returncode == 0
    done = reprobox("run", "mean_bug", timeout=900)
    assert done.returncode == 0, done.stderr
    records = newest_records(scratch_root / "results", "mean_bug")
    assert {r["variant"]: r["verdict"] for r in records.values()} == {
        "broken": "reproduced",
        "fixed": "clean",
    }
    assert "2 of 2 verdicts as expected" in done.stdout + done.stderr


@pytest.mark.e2e
def test_a_wrapped_script_reproduces_and_its_crash_is_never_a_verdict(
    scratch_root: Path, tmp_path: Path
) -> None:
    script = tmp_path / "user_bug.py"
    script.write_text(USER_SCRIPT)
    made = reprobox("new", "user_bug", "--from", str(script), "--fixed-args=--fixed")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (scratch_root / "repros" / "user_bug").iterdir()) == [
        "repro.py", "repro.toml", "user_bug.py",
    ]  # fmt: skip
    done = reprobox("run", "user_bug", timeout=900)
    assert done.returncode == 0, done.stderr
    records = newest_records(scratch_root / "results", "user_bug")
    verdicts = {r["variant"]: r["verdict"] for r in records.values()}
    assert verdicts == {"broken": "reproduced", "fixed": "clean"}

    # the same script, broken otherwise: an ImportError is not the AssertionError reported
    crash = tmp_path / "crash_bug.py"
    crash.write_text(textwrap.dedent("""\
        import sys
        if "--fixed" not in sys.argv:
            import no_such_module_here
    """))  # fmt: skip
    made = reprobox("new", "crash_bug", "--from", str(crash), "--fixed-args=--fixed")
    assert made.returncode == 0, made.stderr
    done = reprobox("run", "crash_bug", timeout=900)
    assert done.returncode != 0 and done.returncode != 1, done.stderr  # an error, not reproduced
    records = newest_records(scratch_root / "results", "crash_bug")
    broken = next(r for r in records.values() if r["variant"] == "broken")
    assert broken["status"] == "error" and broken["verdict"] is None, broken
