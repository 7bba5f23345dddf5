"""`reprobox completion bash|zsh`: a shell completion script for every command, flag and
choice, generated from the one argparse parser by shtab (so a new flag completes with no
edit here), with the repro names completed live: the script asks
`reprobox completion --repros`, which lists them as `reprobox list` finds them.

shtab writes a static script (no Python runs at each Tab but for repro names); argcomplete
would start the whole CLI at every Tab and needs a hook in the entry point.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from reprobox.cli import options
from reprobox.core import spec
from reprobox.core.errors import BadInput

SHELLS = ("bash", "zsh")
REPRO_DESTS = ("repro", "repros")  # the positionals that name repros, on every command
NAMED_REPROS = {("list", "name")}  # and those a command names otherwise

_PREAMBLE = {
    "bash": """\
_reprobox_repros() {  # WORD: the repro names that start with it
  compgen -W "$(reprobox completion --repros 2>/dev/null)" -- "$1"
}""",
    "zsh": """\
_reprobox_repros() {
  local -a names
  names=(${(f)"$(reprobox completion --repros 2>/dev/null)"})
  _describe 'repro' names
}""",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `completion` to the `reprobox` parser."""
    parser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for commands, flags, choices and repro names. "
        "bash: `source <(reprobox completion bash)` (or save it under "
        "~/.local/share/bash-completion/completions/reprobox); zsh: save it as `_reprobox` "
        "in a folder of $fpath.",
    )
    parser.add_argument("shell", nargs="?", choices=SHELLS, help="the shell")
    parser.add_argument(
        "--repros",
        action="store_true",
        help="list the repro names, one a line (what the scripts run at a Tab)",
    )
    parser.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    if args.repros:  # what the scripts call at a Tab: one name a line
        for name in spec.discover(options.settings(args).root):
            sys.stdout.write(name + "\n")
        return 0
    if args.shell is None:
        raise BadInput("completion needs a shell: bash or zsh")
    sys.stdout.write(script(args.shell))
    return 0


def script(shell: str) -> str:
    """The completion script for `shell`, from the parser `reprobox` runs."""
    import shtab

    from reprobox.cli import main  # the whole parser; main imports this module first

    parser = main._parser()
    for action in _repro_actions(parser):
        action.complete = {shell: "_reprobox_repros"}  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell, preamble=_PREAMBLE[shell]) + "\n"


def _repro_actions(parser: argparse.ArgumentParser, command: str = "") -> Iterator[argparse.Action]:
    """The positionals that name a repro, on every (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _repro_actions(sub, name)
        elif not action.option_strings and (
            action.dest in REPRO_DESTS or (command, action.dest) in NAMED_REPROS
        ):
            yield action
