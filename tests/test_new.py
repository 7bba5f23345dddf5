"""`reprobox new` through the real CLI: the scaffold runs both ways as written, a wrapped
script's crash is an error and never "reproduced", and bad input is one line, exit 2, with
nothing left on disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, newest_records, reprobox
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


METRIC_SCRIPT = """\
import json
import sys
from pathlib import Path

if (Path(__file__).parent / "skip").exists():
    print("needs two GPUs; this host has none")
    sys.exit(125)
fixed = "--fixed" in sys.argv
values = [1.0, 2.0, 3.0]
mean = sum(values) / (len(values) if fixed else 2)
print(json.dumps({"mean_error": abs(mean - 2.0)}))
sys.exit(0 if fixed else 1)
"""


@pytest.mark.e2e
def test_a_wrapped_script_keeps_its_contract_its_metric_and_its_name(
    scratch_root: Path, tmp_path: Path
) -> None:
    """`new --from repro.py`: any name will do; the script's own exit 0/1/125 passes
    through (125 stays cannot-test for `verdict`), its reported number decides; the report
    shows `python repro.py` as a person runs it, once the scaffold's title is replaced."""
    script = tmp_path / "repro.py"
    script.write_text(METRIC_SCRIPT)
    made = reprobox(
        "new", "metric_bug", "--from", str(script), "--fixed-args=--fixed",
        "--metric", "mean_error", "--above", "1e-9",
        "--upstream", "https://github.com/example/project/issues/7",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    folder = scratch_root / "repros" / "metric_bug"
    assert sorted(p.name for p in folder.iterdir()) == ["repro.py", "repro.toml", "wrapper.py"]
    done = reprobox("run", "metric_bug", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    records = {
        r["variant"]: r for r in newest_records(scratch_root / "results", "metric_bug").values()
    }
    assert records["broken"]["verdict"] == "reproduced" and records["fixed"]["verdict"] == "clean"
    assert records["broken"]["metrics"]["mean_error"] == 1.0  # the script's number, not 0/1
    assert records["broken"]["decided_by"] == ["mean_error"]

    refused = reprobox("report", "metric_bug", "--no-env")
    assert refused.returncode == ExitCode.BAD_INPUT
    assert refused.stderr.strip() == (
        "reprobox: error: repros/metric_bug/repro.toml still holds what `reprobox new` wrote "
        "(repro.title); say what the bug is and where it is reported before reporting it"
    )
    toml = folder / "repro.toml"
    toml.write_text(
        toml.read_text().replace(": what goes wrong, in one line", ": mean off by 1.5x")
    )
    reported = reprobox("report", "metric_bug", "--no-env")
    assert reported.returncode == 0, reported.stderr
    comment = (scratch_root / "results" / "metric_bug" / "_report" / "comment.md").read_text()
    assert "python repro.py   # expect: reproduced" in comment
    assert "python repro.py --fixed   # expect: clean" in comment
    assert "wrapper.py" not in comment and "fixes/" not in comment
    (folder / "skip").write_text("")  # the script's own 125 stays cannot-test
    skipped = reprobox("verdict", "metric_bug", "--variant", "broken", timeout=900)
    assert skipped.returncode == 125, skipped.stdout + skipped.stderr


def test_a_template_nobody_edited_is_not_reported(scratch_root: Path) -> None:
    assert reprobox("new", "untouched").returncode == 0
    refused = reprobox("report", "untouched", "--no-env")
    assert refused.returncode == ExitCode.BAD_INPUT
    [line] = refused.stderr.splitlines()
    assert line == (
        "reprobox: error: repros/untouched/repro.toml still holds what `reprobox new` wrote "
        "(repro.title, repro.upstream, variants.broken.description, "
        "variants.fixed.description); say what the bug is and where it is reported before "
        "reporting it"
    )


def test_what_it_writes_passes_the_projects_own_lint(scratch_root: Path, tmp_path: Path) -> None:
    """A scaffold committed as written passes `nox -s lint` (ruff check and ruff format with
    this project's settings): the template's script and the wrapper around a user's script."""
    script = tmp_path / "bug.py"
    script.write_text(USER_SCRIPT)
    assert reprobox("new", "plain").returncode == 0
    wrapped = reprobox("new", "wrapped", "--from", str(script), "--fixed-args=--fixed")
    assert wrapped.returncode == 0, wrapped.stderr
    written = [scratch_root / "repros" / "plain" / "plain.py",
               scratch_root / "repros" / "wrapped" / "repro.py"]  # fmt: skip
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in (["check"], ["format", "--check"]):
        done = subprocess.run([sys.executable, "-m", "ruff", *command, *config, *map(str, written)],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
