"""Every flag of the command line, defined once: its spelling, help, default, choices, type
and environment variable (after nox's `_options.py`). Commands compose them by name with
`add(parser, "platform", "timeout", ...)`, so `--platform` means the same on every command,
and a value is checked once, where it is parsed: a bad one is one line and exit 2.

The settings of the process (`REPROBOX_*`) are read once at the CLI's edge into `args.settings`;
`settings(args)` is the one way a command reads them.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from reprobox.cli.table_drawing import TABLE_FORMATS
from reprobox.core import spec, suggest
from reprobox.core.counts import check_count
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.settings import Settings
from reprobox.run.backends import registry as backends

PLATFORMS = ("cpu", "gpu")
N = TypeVar("N", int, float)


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors read as every other bad input does: one line,
    `reprobox: error: --flag: what is wrong`, and where the help is; exit 2."""

    def error(self, message: str) -> NoReturn:
        said = message.removeprefix("argument ")
        chosen = _CHOICE.search(said)
        if chosen and (found := suggest.close_match(chosen[1], _CHOICES.findall(chosen[2]))):
            said = f"{said[: chosen.start()]}invalid choice: {chosen[1]!r}; did you mean {found!r}?"
        ending = "" if said.endswith("?") else f" (see `{self.prog} --help`)"
        self.exit(int(ExitCode.BAD_INPUT), f"reprobox: error: {said}{ending}\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, with "did you mean" for an unknown flag, from the flags of the
        command it was given to (argparse reports a subcommand's leftovers at the top)."""
        found, extras = self.parse_known_args(args, namespace)
        if extras:
            flag = next((word.partition("=")[0] for word in extras if word.startswith("-")), "")
            close = suggest.close_match(flag, _flags(self, found)) if flag else None
            hint = f"; did you mean {close!r}?" if close else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return found


_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")
_CHOICES = re.compile(r"'([^']*)'")


def _flags(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> list[str]:
    """The flags of the (sub)command `parsed` ran: the parser's own and its chosen
    subcommand's."""
    flags = list(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest or "", None) or "")
            if chosen is not None:
                flags += list(chosen._option_string_actions)
    return [flag for flag in flags if flag.startswith("--")]


def positive_int(text: str) -> int:
    """A count of at least one (--workers, --nodes, --max-runs), by `counts.check_count`."""
    return _count(text, least=1)


def natural_int(text: str) -> int:
    """A count that may be zero (--confirm, --verify), by `counts.check_count`."""
    return _count(text, least=0)


def _count(text: str, least: int) -> int:
    try:
        return check_count("-", _number(text, int, "a whole number"), least)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("-: ")) from None


def seconds(text: str) -> float:
    """A timeout, by the one rule of `spec.check_timeout` (finite, above zero)."""
    try:
        spec.check_timeout(value := _number(text, float, "a number of seconds"), "-")
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("-: ")) from None
    return value


def probability(text: str) -> float:
    """A confidence strictly between 0 and 1."""
    value = _number(text, float, "a number")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {value}")
    return value


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _number(text: str, kind: Callable[[str], N], what: str) -> N:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


@dataclass(frozen=True)
class Option:
    """One flag as every command that takes it shows and parses it."""

    name: str  # the key commands compose by (and the default `dest`)
    flags: tuple[str, ...]
    help: str
    default: Any = None
    choices: Sequence[str] | None = None
    type: Callable[[str], Any] | None = None
    env: str | None = None  # the default comes from this variable when it is set
    action: str | None = None
    metavar: str | None = None
    dest: str | None = None
    nargs: str | None = None
    const: Any = None
    required: bool = False

    def kwargs(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """What `add_argument` takes for this flag; an env default is a string argparse
        converts (and checks) with `type` only when the flag is not given."""
        found: dict[str, Any] = {"help": self._help(), "dest": self.dest or self.name}
        default = self.default
        if self.env and environ.get(self.env):
            default = environ[self.env]
        if self.action == "store_true":
            default = False
        found["default"] = [] if self.action == "append" else default
        for key in ("choices", "action", "metavar", "nargs", "const"):
            value = getattr(self, key)
            if value is not None:
                found[key] = value
        if self.type is not None:
            found["type"] = _from_env(self) if self.env else self.type
        if self.required:
            found["required"] = True
        return found

    def _help(self) -> str:
        return f"{self.help} (env {self.env})" if self.env else self.help


def _from_env(option: Option) -> Callable[[str], Any]:
    """`option.type`, naming the environment variable when the value came from there."""
    convert = option.type
    assert convert is not None

    def typed(text: str) -> Any:
        try:
            return convert(text)
        except argparse.ArgumentTypeError as exc:
            if option.env and os.environ.get(option.env) == text:
                raise argparse.ArgumentTypeError(f"{exc} (from {option.env})") from None
            raise

    typed.__name__ = getattr(convert, "__name__", "value")
    return typed


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in [
        # ---- which cell
        Option(
            "variant",
            ("--variant",),
            "a variant (repeatable; verdict, bisect and sweep take one; default: the "
            "default variants, a bisect's or sweep's [bisect] variant)",
            action="append",
            metavar="V",
        ),
        Option(
            "packages",
            ("--with",),
            "run at another version of a pinned package, or at "
            "a git ref of it: PKG@git+URL@REF (a branch, tag, sha or refs/pull/N/head; the "
            "commit is recorded); a bisect or sweep runs every probe with it (resolved to "
            "one commit when it starts; not the package searched) (repeatable)",
            action="append",
            metavar="PKG==VERSION",
        ),
        Option(
            "editables",
            ("--with-editable",),
            "run a pinned package from a checkout as "
            "it is now, uncommitted changes included (built at each run; the commit and "
            "tree are recorded; a change to it mid-bisect stops the bisect) (repeatable)",
            action="append",
            metavar="PKG=PATH",
        ),
        Option(
            "param",
            ("--param",),
            "a matrix parameter passed to the script (repeatable)",
            action="append",
            metavar="NAME=VALUE",
        ),
        Option(
            "platform",
            ("--platform",),
            "where to run, and whose locks and images (default: cpu)",
            default="cpu",
            choices=PLATFORMS,
        ),
        Option(
            "timeout",
            ("--timeout",),
            "seconds per launch (a bisect: per probe); overrides [launch] timeout",
            type=seconds,
            metavar="SECONDS",
        ),
        Option("matrix", ("--matrix",), "run every cell of [matrix]", action="store_true"),
        Option("echo", ("--echo",), "stream the launcher's output", action="store_true"),
        Option(
            "resume",
            ("--resume",),
            "skip cells whose newest measured record has the same lock, code and arguments "
            "(after an interrupt: only what is missing runs)",
            action="store_true",
        ),
        Option(
            "format",
            ("--format",),
            "the verdict table: rich (a terminal), plain "
            "(aligned text, never wrapped), markdown (a pipe table); default auto: rich at "
            "a terminal, else plain",
            default="auto",
            choices=TABLE_FORMATS,
        ),
        # ---- where launches run
        Option(
            "workers",
            ("--workers",),
            "run K launches (a bisect or sweep: probes) at "
            "once (default 1); a bisect then cuts the open range into K+1 parts a round",
            default=1,
            type=positive_int,
            metavar="K",
        ),
        Option(
            "backend",
            ("--backend",),
            backends.help_text(),
            default="venv",
            choices=backends.NAMES,
        ),
        Option("partition", ("--partition",), "slurm: the partition to submit to"),
        Option("gres", ("--gres",), "slurm: generic resources, e.g. gpu:1", metavar="GRES"),
        Option(
            "time",
            ("--time",),
            "slurm: the job time limit (minutes, or [D-]HH:MM:SS; "
            "default: the timeout plus a minute)",
            metavar="LIMIT",
        ),
        Option(
            "container_image",
            ("--container-image",),
            "slurm: run the jobs in this image "
            "through pyxis/enroot (an enroot URI or a squashfs path; the shared paths are "
            "mounted at the same paths)",
            metavar="IMAGE",
        ),
        Option(
            "container_mounts",
            ("--container-mounts",),
            "slurm: more pyxis mounts, with --container-image",
            metavar="SRC:DST[,...]",
        ),
        Option(
            "nodes",
            ("--nodes",),
            "slurm: every launch over N nodes, one task per node ([launch] processes ranks "
            "each; default: [launch] nodes)",
            type=positive_int,
            env="REPROBOX_NODES",
            metavar="N",
        ),
        # ---- bisect and sweep
        Option("package", ("--package",), "the package whose releases to search"),
        Option(
            "good", ("--good",), "a release (or with --commits a ref) where the variant is clean"
        ),
        Option(
            "bad", ("--bad",), "a release (or with --commits a ref) where the variant reproduces"
        ),
        Option("log", ("--log",), "probe log (default: derived from arguments)", type=Path),
        Option(
            "float",
            ("--float",),
            "by date (a date bisect, or an attribution's day end): resolve this package as "
            "of each day (repeatable; default: [bisect] float, else the package searched)",
            default=[],
            action="append",
            metavar="PKG",
        ),
        Option(
            "confirm",
            ("--confirm",),
            "re-run each boundary probe N more times to catch flakiness (default 2: a noisy "
            "history not declared noisy is caught here more often than not)",
            default=2,
            type=natural_int,
            metavar="N",
        ),
        Option(
            "verify",
            ("--verify",),
            "probe K more items spread over each side of the "
            "answer (default: 2 when the range holds more than 8, else 0)",
            type=natural_int,
            metavar="K",
        ),
        Option(
            "flaky",
            ("--flaky",),
            "flake-aware search for a noisy repro (default: on when the repro declares "
            "repeats): a posterior over the boundary and 'no change', re-probing where it is "
            "unsure",
            type=boolean,
            nargs="?",
            const=True,
            metavar="BOOL",
        ),
        Option(
            "confidence",
            ("--confidence",),
            "with --flaky: how sure the answer must be (default 0.999: at 0.99 about one answer "
            "in a hundred was wrong in docs/noise.md's benchmark)",
            default=0.999,
            type=probability,
            metavar="P",
        ),
        Option(
            "max_runs",
            ("--max-runs",),
            "with --flaky: stop after N probe runs, naming the candidates left (default 300; "
            "where the variant's declared test reads a metric, 500 / min-shift^2 launches: "
            "8000 at the default 0.25 sd)",
            default=None,
            type=positive_int,
            metavar="N",
        ),
        Option(
            "min_shift",
            ("--min-shift",),
            "with --flaky on a metric test: the smallest shift of the metric's mean, in standard "
            "deviations, that counts as a change; smaller is 'no change' (default 0.25)",
            default=0.25,
            type=float,
            metavar="SD",
        ),
        # ---- images
        Option(
            "ca_bundle",
            ("--ca-bundle",),
            "extra CA bundle for the build (TLS-intercepting proxies)",
            type=Path,
            env="REPROBOX_CA_BUNDLE",
        ),
        Option(
            "engine",
            ("--engine",),
            "container: the engine (default: REPROBOX_ENGINE, else whichever of podman and "
            "docker works)",
            choices=("podman", "docker"),
        ),
        Option(
            "base",
            ("--base",),
            "container: the base image the Dockerfiles build FROM (e.g. a local stand-in "
            "for python:3.11-slim; default: REPROBOX_BASE_IMAGE, else the Dockerfile's)",
            metavar="IMAGE",
        ),
        Option(
            "wheelhouse",
            ("--wheelhouse",),
            "install from this folder alone (default: the index)",
            type=Path,
            env="REPROBOX_WHEELHOUSE",
        ),
        Option("json", ("--json",), "print JSON instead of text", action="store_true"),
    ]
}


def add(parser: argparse.ArgumentParser, *names: str) -> None:
    """Add the named options to `parser` as OPTIONS defines them (an env default is read
    when the parser is built)."""
    for name in names:
        option = OPTIONS[name]
        parser.add_argument(*option.flags, **option.kwargs(os.environ))


# Flags several commands spell alike for different things, so each command defines its own:
# --out/-o (a report folder, a bundle folder, a JSON file, a YAML file), --memory (a
# container's bound, 16g; a pod's, 32Gi), --dry-run (print the comment; print the plan),
# --from (new's script to wrap; attribute's first environment).
PER_COMMAND = frozenset({"--out", "-o", "--memory", "--dry-run", "--from"})

CELL = ("variant", "packages", "editables", "param", "platform", "timeout")
SLURM_ONLY = ("partition", "gres", "time", "container_image", "container_mounts", "nodes")
CONTAINER_ONLY = ("engine", "base")
BACKEND = ("backend", *SLURM_ONLY, *CONTAINER_ONLY)


def settings(args: argparse.Namespace) -> Settings:
    """The process's settings: read once at the CLI's edge (`cli.main`); a handler called
    on its own (a test, another entry point) reads them here."""
    found = getattr(args, "settings", None)
    return found if isinstance(found, Settings) else Settings.from_env()
