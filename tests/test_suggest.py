"""Did you mean: one rule (`core.suggest`) for an unknown repro, variant, flag and package,
through the real CLI: one line, exit 2 (bad input), nothing launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core import suggest
from reprobox.core.errors import ExitCode


def test_close_names_are_suggested_and_far_ones_listed() -> None:
    assert suggest.close_match("kll", ["kl", "lm_head", "shuffle_seed"]) == "kl"
    assert suggest.close_match("Torch", ["torch", "numpy"]) == "torch"
    assert suggest.close_match("zzz", ["kl", "lm_head"]) is None
    assert suggest.hint("kll", ["kl", "lm_head"]) == "; did you mean 'kl'?"
    assert suggest.hint("zzz", ["kl", "lm_head"]) == "; known: kl, lm_head"
    assert suggest.hint("zzz", ["a"], "it has") == "; it has: a"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", "tyo"], "unknown repro 'tyo'; did you mean 'toy'?"),
        (["run", "toy", "--variant", "claen"], "repro 'toy' has no variant 'claen'; "
         "did you mean 'clean'?"),
        (["run", "toy", "--wrkers", "2"], "unrecognized arguments: --wrkers 2; "
         "did you mean '--workers'?"),
        (["bisect", "toy", "--confirn=2"], "unrecognized arguments: --confirn=2; "
         "did you mean '--confirm'?"),
        (["rnu", "toy"], "COMMAND: invalid choice: 'rnu'; did you mean 'run'?"),
        (["run", "toy", "--platform", "gpx"], "--platform: invalid choice: 'gpx'; "
         "did you mean 'gpu'?"),
        (["run", "toy", "--with", "numpyy==1.26.4"], "--with numpyy: not a package that toy "
         "pins; did you mean 'numpy'?"),
        (["sweep", "toy", "--package", "trch", "--range", "2.12.0..2.13.0"],
         "--package trch: not a package that toy pins; did you mean 'torch'?"),
        (["bisect", "toy", "--package", "nmpy", "--good", "1.25.0", "--bad", "1.26.0"],
         "--package nmpy: not a package that toy pins; did you mean 'numpy'?"),
    ],
)  # fmt: skip
def test_an_unknown_name_is_one_line_with_a_suggestion(
    toy_root: Path, argv: list[str], line: str
) -> None:
    done = reprobox(*argv, timeout=120)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"reprobox: error: {line}"]
    assert not (toy_root / "results").exists()  # refused before anything ran


def test_a_name_with_no_close_match_lists_the_known_ones(toy_root: Path) -> None:
    done = reprobox("run", "zzzzzz", timeout=120)
    assert done.returncode == ExitCode.BAD_INPUT
    assert done.stderr.splitlines() == ["reprobox: error: unknown repro 'zzzzzz'; known: toy"]
