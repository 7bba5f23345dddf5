"""`reprobox completion bash|zsh`: a shell completion script for every command, flag and
choice, generated from the one argparse parser by shtab (so a new flag completes with no
edit here), with the repro names and a repro's variants completed live: the script asks
`reprobox completion --repros` (or `--variants REPRO`), which list them as `reprobox list`
finds them.

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
}
_reprobox_variants() {  # WORD: the variants of the repro named right after the command
  [[ ${COMP_WORDS[2]-} == -* ]] && return 0
  compgen -W "$(reprobox completion --variants "${COMP_WORDS[2]-}" 2>/dev/null)" -- "$1"
}""",
    "zsh": """\
_reprobox_repros() {
  local -a names
  names=(${(f)"$(reprobox completion --repros 2>/dev/null)"})
  _describe 'repro' names
}
_reprobox_variants() {
  local -a names
  [[ ${words[3]-} == -* ]] && return 0
  names=(${(f)"$(reprobox completion --variants "${words[3]-}" 2>/dev/null)"})
  _describe 'variant' names
}""",
}


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    whole: argparse.ArgumentParser,
) -> None:
    """Add `completion` to the `reprobox` parser, `whole`: the one its scripts are made from
    (handed down by `cli.main`, which imports this module, never imported back)."""
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
        "--variants",
        metavar="REPRO",
        help="list the variants of REPRO, one a line (what the scripts run at a Tab)",
    )
    parser.add_argument(
        "--repros",
        action="store_true",
        help="list the repro names, one a line (what the scripts run at a Tab)",
    )
    parser.set_defaults(handler=lambda args: cmd_completion(args, whole))


def cmd_completion(args: argparse.Namespace, whole: argparse.ArgumentParser) -> int:
    if args.repros:  # what the scripts call at a Tab: one name a line
        for name in spec.discover(options.settings(args).root):
            sys.stdout.write(name + "\n")
        return 0
    if args.variants is not None:
        root = options.settings(args).root
        if args.variants in spec.discover(root):
            for name in spec.load(root, args.variants).spec.variants:
                sys.stdout.write(name + "\n")
        return 0  # a half-typed name completes to nothing, never an error at a Tab
    if args.shell is None:
        raise BadInput("completion needs a shell: bash or zsh")
    sys.stdout.write(script(args.shell, whole))
    return 0


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for `shell`, from the parser `reprobox` runs."""
    import shtab  # start-up cost: only `reprobox completion SHELL` needs it

    for action in _actions(parser):
        function = "_reprobox_variants" if action.option_strings else "_reprobox_repros"
        action.complete = {shell: function}  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell, preamble=_PREAMBLE[shell]) + "\n"


def _actions(parser: argparse.ArgumentParser, command: str = "") -> Iterator[argparse.Action]:
    """The positionals that name a repro and the --variant flags, on every (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, name)
        elif "--variant" in action.option_strings:
            yield action
        elif not action.option_strings and (
            action.dest in REPRO_DESTS or (command, action.dest) in NAMED_REPROS
        ):
            yield action
