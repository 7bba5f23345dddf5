"""The option model: each flag defined once (cli/options.py) and composed by every command,
environment defaults shown in the help and read when a flag is not given, and bad values
refused as the CLI parses them, in one line with exit 2 (255 for `verdict`)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from conftest import ROOT, reprobox
from reprobox.cli import main as cli
from reprobox.cli import options
from reprobox.core.errors import ExitCode

CLI = ROOT / "src" / "reprobox" / "cli"


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _flags() -> dict[str, list[tuple[str, argparse.Action]]]:
    """Every flag of every command: the commands that take it, with its action there."""
    found: dict[str, list[tuple[str, argparse.Action]]] = {}
    for name, parser in _commands().items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    found.setdefault(flag, []).append((name, action))
    return found


def _shown(action: argparse.Action) -> str:
    kind = getattr(action.type, "__name__", None)
    return repr((action.help, action.default, action.choices, kind, action.dest, action.nargs))


def test_a_flag_on_several_commands_is_the_one_options_defines() -> None:
    defined = {flag: o for o in options.OPTIONS.values() for flag in o.flags}
    for flag, uses in _flags().items():
        if len(uses) < 2 or flag in options.PER_COMMAND:
            continue
        assert flag in defined, f"{flag} on {[c for c, _ in uses]} is not in cli/options.py"
        assert len({_shown(a) for _, a in uses}) == 1, f"{flag} differs between commands"


def test_every_flag_options_defines_is_parsed_as_defined() -> None:
    defined = {flag: o for o in options.OPTIONS.values() for flag in o.flags}
    for flag, uses in _flags().items():
        if flag not in defined:
            continue
        option = defined[flag]
        for command, action in uses:
            assert action.help == option.kwargs({})["help"], (command, flag)
            assert action.dest == (option.dest or option.name), (command, flag)
    platform = {command for command, _ in _flags()["--platform"]}
    assert platform == {"run", "verdict", "image", "bisect", "sweep", "bundle", "wheelhouse",
                        "k8s", "attribute"}  # fmt: skip
    for _, action in _flags()["--platform"]:
        assert (action.default, tuple(action.choices or ())) == ("cpu", ("cpu", "gpu"))


def test_options_are_added_only_in_cli_options() -> None:
    """No command module spells a shared flag itself: `add_argument("--platform", ...)`."""
    shared = {flag for o in options.OPTIONS.values() for flag in o.flags}
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                said = {a.value for a in node.args if isinstance(a, ast.Constant)}
                assert not said & shared, f"{path.name}: {said & shared} is in cli/options.py"


def test_the_cli_reads_settings_in_one_place_and_main_only_dispatches() -> None:
    for path in CLI.glob("*.py"):
        text = path.read_text()
        if path.name != "options.py":
            assert "Settings.from_env" not in text or path.name == "main.py", path.name
        # options: env defaults; ui: CI decides plain output before `ui.configure` is told
        if path.name not in ("options.py", "ui.py"):
            assert "os.environ.get(" not in text, path.name
    assert len((CLI / "main.py").read_text().splitlines()) <= 300
    src = ROOT / "src" / "reprobox"
    for path in [*src.rglob("*.py"), ROOT / "noxfile.py"]:
        text = path.read_text()
        for alias in ("cells as matrix", "pipeline as workflow", "noxview as sessions"):
            assert alias not in text, f"{path.relative_to(ROOT)}: {alias}"


def _parser_with(*names: str) -> argparse.ArgumentParser:
    parser = options.Parser(prog="reprobox try")
    options.add(parser, *names)
    return parser


def test_an_env_variable_is_the_default_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPROBOX_NODES", raising=False)
    assert _parser_with("nodes").parse_args([]).nodes is None
    monkeypatch.setenv("REPROBOX_NODES", "3")
    assert _parser_with("nodes").parse_args([]).nodes == 3
    assert _parser_with("nodes").parse_args(["--nodes", "2"]).nodes == 2
    monkeypatch.setenv("REPROBOX_CA_BUNDLE", "/etc/ssl/extra.pem")
    assert _parser_with("ca_bundle").parse_args([]).ca_bundle == Path("/etc/ssl/extra.pem")


def test_a_bad_env_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REPROBOX_NODES", "zero")
    with pytest.raises(SystemExit) as stopped:
        _parser_with("nodes").parse_args([])
    assert stopped.value.code == ExitCode.BAD_INPUT
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "reprobox: error: --nodes: 'zero' is not a whole number (from REPROBOX_NODES) "
        "(see `reprobox try --help`)"
    ]


def test_the_flaky_options_parse_as_specified() -> None:
    """--flaky [BOOL] (None: the repro's declaration decides), --confidence, --max-runs."""
    parser = _parser_with("flaky", "confidence", "max_runs")
    args = parser.parse_args([])
    # --max-runs: None, the strategy's default (300 verdicts; 500 / min-shift^2 launches of a
    # metric)
    assert (args.flaky, args.confidence, args.max_runs) == (None, 0.999, None)
    args = parser.parse_args(["--flaky", "--confidence", "0.9", "--max-runs", "40"])
    assert (args.flaky, args.confidence, args.max_runs) == (True, 0.9, 40)
    assert parser.parse_args(["--flaky", "false"]).flaky is False


def test_help_shows_env_variables(scratch_root: Path) -> None:
    done = reprobox("image", "--help")
    assert done.returncode == 0, done.stderr
    assert "(env REPROBOX_CA_BUNDLE)" in " ".join(done.stdout.split())
    done = reprobox("gpu-check", "--help")
    assert "(env REPROBOX_WHEELHOUSE)" in " ".join(done.stdout.split())
    for command, parser in _commands().items():  # every other command's help, in-process
        assert parser.format_help().startswith(f"usage: reprobox {command}"), command


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "toy", "--workers", "0"], "--workers: must be 1 or more, not 0"),
        (["bisect", "toy", "--workers", "-2"], "--workers: must be 1 or more, not -2"),
        (["sweep", "toy", "--range", "1..2", "--workers", "x"], "--workers: 'x' is not a whole"),
        (["bisect", "toy", "--confirm", "-1"], "--confirm: must be 0 or more, not -1"),
        (["bisect", "toy", "--verify", "-1"], "--verify: must be 0 or more, not -1"),
        (["run", "toy", "--timeout", "abc"], "--timeout: 'abc' is not a number of seconds"),
        (["run", "toy", "--timeout", "inf"], "--timeout: inf is not a timeout"),
        (["bundle", "toy", "--platform", "tpu"], "--platform: invalid choice: 'tpu'"),
        (["k8s", "toy", "--platform", "tpu"], "--platform: invalid choice: 'tpu'"),
        (["k8s", "toy", "--parallelism", "0"], "--parallelism: must be 1 or more, not 0"),
        (["k8s", "toy", "--ttl", "-1"], "--ttl: must be 0 or more, not -1"),
        (["run"], "the following arguments are required: repro"),
        (["bisect", "toy", "--variant", "a", "--variant", "b"], "a bisect runs one --variant"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(toy_root: Path, argv: list[str], said: str) -> None:
    done = reprobox(*argv, timeout=120)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reprobox: error: "), done.stderr
    assert said in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert not (toy_root / "results").exists()


def test_verdict_answers_255_for_a_bad_value(toy_root: Path) -> None:
    done = reprobox("verdict", "toy", "--timeout", "0", timeout=120)
    assert done.returncode == 255, done.stderr
    assert done.stderr.strip().splitlines() == [
        "reprobox: error: --timeout: 0.0 is not a timeout; give a finite number of seconds > 0 "
        "(see `reprobox verdict --help`)"
    ]


def test_every_layer_that_takes_workers_says_what_the_parser_says(tmp_path: Path) -> None:
    """One rule (`core.counts.check_count`) for a count: the parser, a bisect's strategy, the
    back-end factory and the pure searches refuse --workers 0 in the same words."""
    from reprobox.bisect.flaky import flaky_search
    from reprobox.bisect.search import ThreadRunner, multisect
    from reprobox.bisect.strategy import Strategy
    from reprobox.core.errors import BadInput
    from reprobox.core.settings import Settings
    from reprobox.run.backends import BackendFlags, make_backend

    settings = Settings.from_env({"REPROBOX_RESULTS": str(tmp_path)})
    said = "--workers: must be 1 or more, not 0"
    with pytest.raises(argparse.ArgumentTypeError, match=said.removeprefix("--workers: ")):
        options.positive_int("0")
    for call in (
        lambda: Strategy(workers=0).check(),
        lambda: make_backend("venv", settings, BackendFlags(workers=0)),
        lambda: multisect([1, 2], lambda item, attempt: None, workers=0),
        lambda: flaky_search([1, 2], lambda item: None, workers=0),
        lambda: ThreadRunner(lambda item, attempt: None, 0),
    ):
        with pytest.raises(BadInput, match=said):
            call()
