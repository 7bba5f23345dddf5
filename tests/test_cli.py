"""The command line as a user meets it: --version, help on every flag, `list NAME`, the verdict
table outside a terminal, record text that is never read as markup, and `lock` regeneration.

Commands run as a user runs them (a subprocess, exit code and all) against a scratch checkout
and records written to a temporary results folder; nothing here needs the network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path

import pytest

from conftest import ROOT, reprobox, write_repro
from reprobox.cli import main as cli
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.records import Record
from reprobox.core.settings import Settings
from reprobox.envs import locks
from reprobox.run import regenerate as regen
from reprobox.run.dockerfile import dockerfile_path
from reprobox.run.pipeline import lock_path, lock_request

# ---- the parser


def _walk(parser: argparse.ArgumentParser, path: str = "reprobox"):
    """Every (command path, action) of the parser, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest}", choice
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_flag_and_command_has_help() -> None:
    missing = [
        f"{where}: {'/'.join(action.option_strings) or action.dest}"
        for where, action in _walk(cli._parser())
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert not missing, f"no help text: {missing}"


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_each_command_loads_only_its_own_module() -> None:
    """The table `reprobox CMD` imports by names every command once, in --help's order,
    and each command's own module registers it (a command missing from the table, or under
    another module's name, would load every module, or break)."""
    assert _commands(cli._parser()) == list(cli.COMMANDS)
    for command, module in cli.COMMANDS.items():
        alone = _commands(cli._parser([command, "x"]))
        everything = command == "completion"  # completion describes every command
        assert command in alone and (
            everything or set(alone) <= {c for c, m in cli.COMMANDS.items() if m == module}
        )
    code = (
        "import sys; from reprobox.cli import main; main._parser(['run', 'toy']); "
        "print(sorted(sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = done.stdout
    assert "reprobox.cli.run" in loaded
    assert "reprobox.cli.bisect" not in loaded and "reprobox.cli.report" not in loaded


def test_version_comes_from_the_installed_distribution() -> None:
    done = reprobox("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"reprobox {metadata.version('reprobox')}"


def test_help_is_written_for_users() -> None:
    done = reprobox("--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "reprobox list" in text and "reprobox run NAME" in text  # where a newcomer starts
    assert "results/<repro>/<cell>/<time>/" in text  # where results go
    assert "exit status:" in text
    assert "turn errors into one line" not in text  # not the module docstring


@pytest.mark.parametrize("command", ["run", "table", "image"])
def test_table_commands_take_a_format(command: str) -> None:
    args = cli._parser().parse_args([command, *(["toy"] if command != "table" else [])])
    assert args.format == "auto"
    args = cli._parser().parse_args([command, "toy", "--format", "markdown"])
    assert args.format == "markdown"
    done = reprobox(command, "toy", "--format", "html")
    assert done.returncode == ExitCode.BAD_INPUT and "invalid choice" in done.stderr


# ---- list


def test_list_one_repro_in_full(toy_root: Path) -> None:
    done = reprobox("list", "toy")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("toy: toy repro for the harness tests\n")
    assert "upstream:  https://example.invalid/toy" in out
    assert "launched with python, 2 processes (timeout 60s)" in out
    assert "verdict:   reproduced if level > 0" in out
    assert "bisect:    numpy, good 1.25.0, bad 1.26.4 (variant gate)" in out
    assert "    cannot: expect clean (or cannot_test); not default" in out
    assert "    fixed: expect clean; not default; fix toy_fix" in out
    assert (
        "    hang_torchrun: expect clean; not default; launch: launcher torchrun, timeout 10" in out
    )
    assert "cells (2 default, 4 matrix):" in out
    # a matrix cell keeps its brackets and names the expectation its rule gives it
    line = next(line for line in out.splitlines() if line.strip().startswith("clean[level=2]"))
    assert line.split()[1] == "reproduced"
    assert line.endswith("reprobox run toy --variant clean --param=level=2")


def test_list_one_repro_as_json(toy_root: Path) -> None:
    done = reprobox("list", "toy", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["repro"] == "toy" and found["matrix_note"] is None
    assert found["launch"]["launcher"] == "python" and found["launch"]["processes"] == 2
    assert found["verdict"] == [{"metric": "level", "above": 0.0}]
    assert found["variants"]["cannot"]["also_ok"] == ["cannot_test"]
    assert found["variants"]["fixed"]["fix"] == "toy_fix"
    assert found["variants"]["hang"]["launch"] == {"timeout": 8.0}
    cells = {c["label"]: c for c in found["cells"]}
    assert list(cells) == [
        "clean",
        "reproduced",
        "clean[level=0]",
        "clean[level=2]",
        "reproduced[level=0]",
        "reproduced[level=2]",
    ]
    assert cells["clean[level=2]"]["expect"] == "reproduced"
    assert cells["clean[level=2]"]["kind"] == "matrix"


def test_list_without_a_name_is_unchanged(toy_root: Path) -> None:
    done = reprobox("list", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["repro"] == "toy" and row["default_cells"] == ["clean", "reproduced"]
    assert row["variants"]["cannot"] == {"expect": "clean", "default": False, "description": ""}
    text = reprobox("list")
    assert text.returncode == 0 and text.stdout.startswith("toy: toy repro for the harness tests")


def test_list_an_unknown_repro_is_one_line(toy_root: Path) -> None:
    done = reprobox("list", "tyo")
    assert done.returncode == ExitCode.BAD_INPUT
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "reprobox: error: unknown repro 'tyo'; did you mean 'toy'?"
    )


_RANGED = """
[repro]
title = "a repro whose matrix is a version range"
upstream = "https://example.invalid/ranged"
script = "script.py"

[launch]
launcher = "python"
processes = 1
timeout = 60

[env]
pins = ["samplepkg==1.0.0"]

[verdict]
reproduced_if = [{ metric = "m", above = 0.0 }]

[variants.broken]
expect = "reproduced"

[matrix]
variants = ["broken"]
packages = { samplepkg = ">=1.0,<2" }
"""


def _page(*versions: str) -> dict:
    """A PEP 691 project page with one wheel per version."""
    files = [
        {"filename": f"samplepkg-{v}-py3-none-any.whl", "url": f"samplepkg-{v}.whl", "hashes": {}}
        for v in versions
    ]
    return {"meta": {"api-version": "1.1"}, "name": "samplepkg", "files": files}


def test_list_a_range_it_cannot_resolve_says_so(
    scratch_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_repro(scratch_root, "ranged", _RANGED)
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))  # no cached release list
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    done = reprobox("list", "ranged")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stdout.splitlines() if "matrix cells not listed" in line]
    assert len(notes) == 1 and "samplepkg >=1.0,<2" in notes[0], done.stdout
    assert "cells (1 default):" in done.stdout
    found = json.loads(reprobox("list", "ranged", "--json").stdout)
    assert [c["label"] for c in found["cells"]] == ["broken"]
    assert "samplepkg" in found["matrix_note"]


def test_list_a_range_resolves_from_the_index(
    scratch_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_repro(scratch_root, "ranged", _RANGED)
    cache = tmp_path / "cache"
    (cache / "index").mkdir(parents=True)
    (cache / "index" / "samplepkg.json").write_text(json.dumps(_page("0.9", "1.0.0", "1.2", "2.0")))
    monkeypatch.setenv("REPROBOX_CACHE", str(cache))  # a fresh release list: no network read
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    found = json.loads(reprobox("list", "ranged", "--json").stdout)
    assert [c["label"] for c in found["cells"]] == [
        "broken",
        "broken[samplepkg=1.0.0]",
        "broken[samplepkg=1.2]",
    ]
    assert found["matrix_note"] is None


# ---- the verdict table from disk: outside a terminal, and never markup


def _record(root: Path, label: str, **fields: object) -> Record:
    """A record of the toy repro written where `reprobox table` reads it."""
    variant = label.split("[", 1)[0]
    slug = label.replace("[", "@").rstrip("]")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"
    run_dir = root / "results" / "toy" / f"cpu-{slug}" / stamp
    run_dir.mkdir(parents=True)
    values: dict = {
        "repro": "toy",
        "variant": variant,
        "label": label,
        "packages": {},
        "params": {},
        "expect": "reproduced",
        "also_ok": [],
        "status": "match",
        "verdict": "reproduced",
        "metrics": {"level": 1.0},
        "decided_by": ["level"],
        "wall_s": 2.5,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dir": str(run_dir),
    }
    values.update(fields)
    record = Record(**values)
    record.save()
    return record


LABEL = "broken[transformers=4.44.2]"
REASON = "rank 1 exited 1; see [/tmp/results/toy/rank1.log] and [bold]"


@pytest.fixture
def marked_up(toy_root: Path) -> Path:
    """Records whose text looks like rich markup: a bracketed label and a path in brackets."""
    _record(toy_root, LABEL, packages={"transformers": "4.44.2"})
    _record(
        toy_root,
        "fixed",
        expect="clean",
        status="error",
        verdict=None,
        metrics={},
        decided_by=[],
        reason=REASON,
        exit_code=int(ExitCode.RUN_FAILED),
    )
    return toy_root


def test_table_outside_a_terminal_is_plain_and_never_wraps(marked_up: Path) -> None:
    done = reprobox("table", "toy")  # stdout is a pipe: the plain table
    assert done.returncode == ExitCode.RUN_FAILED, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "reprobox verdicts"
    header, rule, *rows = lines[1 : lines.index("")]  # then the notes and the tally line
    assert header.split() == "repro cell expected verdict status decided by measured wall s".split()
    assert lines[-1].startswith("1 of 2 verdicts as expected; missed: toy fixed gave error")
    assert set(rule.replace(" ", "")) == {"-"}
    assert len(rows) == 2
    broken = next(row for row in rows if LABEL in row)  # the version survives, on one line
    assert "level=1" in broken and broken.split()[:2] == ["toy", LABEL]
    fixed = next(row for row in rows if " fixed " in row)
    assert REASON in fixed  # the reason as written, brackets and all
    assert "\x1b[" not in done.stdout  # no terminal control codes in a log
    # the failure's last line quotes the reason as written too
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"reprobox: error: toy fixed: no measured verdict; {REASON}"


def test_table_rich_does_not_read_record_text_as_markup(marked_up: Path) -> None:
    done = reprobox("table", "toy", "--format", "rich")
    assert done.returncode == ExitCode.RUN_FAILED, done.stderr
    assert "Traceback" not in done.stderr and "MarkupError" not in done.stderr
    assert "┃" in done.stdout or "│" in done.stdout  # the rich table, not the plain one
    assert LABEL in done.stdout  # COLUMNS=200: wide enough that nothing folds
    assert "[/tmp/results/toy/rank1.log]" in done.stdout and "[bold]" in done.stdout


def test_table_as_markdown(marked_up: Path) -> None:
    done = reprobox("table", "toy", "--format", "markdown")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| repro ") and lines[0].endswith(" |")
    assert lines[1].startswith("| -----") and lines[1].endswith(": |")  # wall s right-aligned
    assert any(f"| {LABEL} |" in line for line in lines)
    assert len({len(line) for line in lines}) == 1  # sized to its content: columns line up


# ---- lock: regeneration lives in run.regenerate; the command prints what it wrote


def _write_current_locks(root: Path) -> list[Path]:
    """Locks whose header matches what repro.toml asks for today (no resolver needed)."""
    repro = spec.load(root, "toy")
    written = []
    for variant in repro.variants_on("cpu"):
        path = lock_path(repro, variant, "cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        request = lock_request(repro, variant, "cpu")
        path.write_text(locks.header_line(request.input_hash, b"") + "\n")
        written.append(path)
    return written


def test_regenerate_checks_then_writes_only_what_is_out_of_date(
    toy_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock_files = _write_current_locks(toy_root)
    dockerfile = dockerfile_path(toy_root, spec.load(toy_root, "toy"))
    stale = lock_files[0]
    current = stale.read_text()
    stale.write_text(f"{locks.LOCK_HEADER}0000000000000000\n")  # from another repro.toml

    problems = regen.regenerate(Settings.from_env(), ["toy"], check=True)
    assert problems == [
        f"{stale.relative_to(toy_root)} is stale",
        f"{dockerfile.relative_to(toy_root)} is missing",
    ]
    assert not dockerfile.exists()  # a check writes nothing

    compiled: list[Path] = []
    monkeypatch.setattr(
        locks, "compile_lock", lambda request, path, settings: compiled.append(path)
    )
    heard: list[Path] = []
    assert (
        regen.regenerate(Settings.from_env(), ["toy"], check=False, on_written=heard.append) == []
    )
    assert compiled == [stale]  # only the stale lock is resolved again
    assert heard == [stale, dockerfile] and dockerfile.is_file()
    stale.write_text(current)  # as the resolver would have written it
    assert regen.regenerate(Settings.from_env(), ["toy"], check=True) == []


def test_regenerate_loads_every_repro_before_writing(toy_root: Path) -> None:
    _write_current_locks(toy_root)
    with pytest.raises(BadInput, match="unknown repro 'nope'"):
        regen.regenerate(Settings.from_env(), ["toy", "nope"], check=False)
    assert not dockerfile_path(toy_root, spec.load(toy_root, "toy")).exists()


def test_lock_check_command_names_what_is_out_of_date(toy_root: Path) -> None:
    _write_current_locks(toy_root)
    done = reprobox("lock", "--check", "toy")
    assert done.returncode == ExitCode.BAD_INPUT
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("reprobox: error: out of date with repro.toml: ")
    assert "Dockerfile is missing" in line and line.endswith("run `nox -s lock`")
    done = reprobox("lock", "toy")  # every lock is current: only the Dockerfile is written
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("Dockerfile: written")
    assert reprobox("lock", "--check", "toy").returncode == 0


def test_nox_verdicts_shows_record_text_as_written(marked_up: Path) -> None:
    """`nox -s verdicts` (the end of `make repro`) prints the same table through nox."""
    nox = Path(sys.executable).parent / "nox"
    done = subprocess.run(
        [str(nox), "-f", str(ROOT / "noxfile.py"), "-s", "verdicts", "--", "--all"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert "Traceback" not in done.stderr and "MarkupError" not in done.stderr, done.stderr
    assert LABEL in done.stdout and REASON in done.stdout, done.stdout + done.stderr
