"""`reprobox new NAME [--from SCRIPT]`: scaffold a repro that runs both ways at once.

Without `--from`: a two-rank torchrun script that speaks the protocol (result file, exit
codes) around one `measure()` to replace, with a broken and a fixed variant that already
differ, so the first `reprobox run NAME` shows the loop working before any edit.

With `--from`: the user's own script (any name), copied beside a small wrapper that runs it
as a maintainer would (`python SCRIPT ARGS`) and keeps its contract: exit 0 clean, 1
reproduced, 125 cannot test, any other exit an error, and a traceback whose last line does
not name `--reproduced-if-error` a crash (an error, never a verdict). `--metric` makes the
number the script reports decide. A repro proves itself both ways, so the fixed variant
must be named: other pins (`--fixed-with`) or other arguments (`--fixed-args`). The title,
the upstream link and the template's descriptions are `core.scaffold`'s placeholders, which
`report` refuses until they are replaced.

The files are written from templates, then loaded back with `spec.load`: a scaffold the
harness would refuse is never left on disk. `cli.main` adds the command with `register`."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import shutil
import sys
from importlib import resources
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from reprobox.cli import options, ui
from reprobox.core import scaffold, spec
from reprobox.core.errors import BadInput, ReproboxError

NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
DEFAULT_PINS = ("torch==2.13.0", "numpy<2")
WRAPPER = "repro.py"
# Top-level modules of the training stack a repro's script (or what it imports) may import;
# a repro named after one would have its script shadow it (`repros/torch/torch.py`).
STACK_MODULES = frozenset({
    "torch", "torchvision", "torchaudio", "numpy", "transformers", "datasets", "accelerate",
    "deepspeed", "peft", "trl", "tokenizers", "safetensors", "huggingface_hub", "triton",
    "sympy", "networkx", "jinja2", "filelock", "fsspec", "typing_extensions", "packaging",
    "yaml", "regex", "tqdm", "requests", "psutil", "scipy", "pandas", "einops", "evaluate",
})  # fmt: skip
OTHER_WRAPPER = "wrapper.py"  # when the script itself is named repro.py


def _text(name: str) -> str:
    """A template of `templates/` (scripts a repro holds: text here, never run by reprobox)."""
    return resources.files("reprobox.cli").joinpath("templates", name).read_text()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `new` to the `reprobox` parser."""
    new = subparsers.add_parser(
        "new",
        help="scaffold a repro (repro.toml and a script speaking the protocol)",
        description="Write repros/NAME/: repro.toml and a script that runs both ways at once. "
        "With --from, your own script is wrapped: exit 0 is clean, a failure naming "
        "--reproduced-if-error is reproduced, any other failure an error.",
    )
    new.add_argument("name", metavar="NAME", help="the repro's name: lower case, digits, _")
    new.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="SCRIPT",
        help="wrap this script (copied into the repro) instead of the template",
    )
    new.add_argument(
        "--pins",
        nargs="+",
        metavar="PIN",
        help=f"the environment's pins (default: {' '.join(DEFAULT_PINS)})",
    )
    new.add_argument("--upstream", default="", metavar="URL", help="the upstream issue")
    new.add_argument(
        "--fixed-with",
        nargs="+",
        default=[],
        metavar="PIN",
        help="--from: the pins of the fixed variant (the release that fixes it)",
    )
    new.add_argument(
        "--fixed-args",
        default="",
        metavar="ARGS",
        help="--from: the arguments of the fixed variant (a workaround flag)",
    )
    new.add_argument(
        "--broken-args",
        default="",
        metavar="ARGS",
        help="--from: the arguments of the broken variant",
    )
    new.add_argument("--reproduced-if-error", default="AssertionError", metavar="TEXT",
                     help="--from: a failure with a traceback reproduces only when its last "
                     "error line holds TEXT (default: AssertionError)")  # fmt: skip
    new.add_argument("--metric", metavar="NAME",
                     help="--from: the metric that decides, as the script reports it (a "
                     "last stdout line of JSON, {\"NAME\": 0.5}, or its own $REPRO_RESULT); "
                     "default: the exit code's 0/1 as expected_failure")  # fmt: skip
    new.add_argument("--above", type=float, default=0.0, metavar="X",
                     help="--from --metric: reproduced when NAME > X (default 0)")  # fmt: skip
    new.set_defaults(handler=cmd_new)


def cmd_new(args: argparse.Namespace) -> int:
    root = options.settings(args).root
    if not NAME.fullmatch(args.name):
        raise BadInput(f"repro name {args.name!r}: lower case letters, digits and _, 1 to 40")
    folder = root / "repros" / args.name
    if folder.exists():
        raise BadInput(f"repros/{args.name} exists already; pick another name")
    pins = list(args.pins or DEFAULT_PINS)
    if args.source is None:
        if args.fixed_with or args.fixed_args or args.broken_args or args.metric:
            raise BadInput("--fixed-with, --fixed-args, --broken-args and --metric go with --from")
        files = _template(args.name, pins, args.upstream)
        _refuse_a_shadow(args.name, files[f"{args.name}.py"], pins)
    else:
        files = _wrapped(args, pins)
    folder.mkdir(parents=True)
    try:
        for name, text in files.items():
            (folder / name).write_text(text)
        if args.source is not None:
            shutil.copy(args.source, folder / args.source.name)
        spec.load(root, args.name)  # what the harness would refuse is not left behind
    except (OSError, ReproboxError):
        shutil.rmtree(folder, ignore_errors=True)
        raise
    ui.info(f"wrote repros/{args.name}/: {', '.join(sorted([*files, *_copied(args)]))}")
    print(f"next: reprobox run {args.name}    (both variants; then edit, and run again)")
    return 0


def _refuse_a_shadow(name: str, script: str, pins: list[str]) -> None:
    """The template's script is `NAME.py`, first on its own `sys.path`: a name that is a
    module it, its pins or the stack import (`torch`, `json`, `numpy`) would be imported
    from that file instead, and every rank would fail."""
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.ImportFrom) and node.module and not node.level
    }
    pinned = set()
    for pin in pins:
        try:
            pinned.add(Requirement(pin).name.lower().replace("-", "_"))
        except InvalidRequirement:
            continue  # spec.load names it
    if name in imported | pinned | STACK_MODULES | set(sys.stdlib_module_names):
        raise BadInput(
            f"repro name {name!r}: its script repros/{name}/{name}.py would shadow the "
            f"module {name} (imported before the real one: every rank would fail); "
            f"pick another name, such as {name}_issue"
        )


def _copied(args: argparse.Namespace) -> list[str]:
    return [args.source.name] if args.source is not None else []


def _toml(name: str, script: str, pins: list[str], upstream: str, launch: str,
          rule: str, variants: str, shown: str = "") -> str:  # fmt: skip
    by_hand = f"\nby_hand = {json.dumps(shown)}" if shown else ""
    return f"""\
[repro]
title = "{name}{scaffold.TITLE}"
upstream = {json.dumps(upstream or scaffold.UPSTREAM)}
script = "{script}"{by_hand}

[launch]
{launch}

[env]
python = "3.11"
pins = {json.dumps(pins)}

[verdict]
reproduced_if = [{rule}]
{variants}"""


def _template(name: str, pins: list[str], upstream: str) -> dict[str, str]:
    variants = f"""
[variants.broken]
expect = "reproduced"
description = "sums the ranks' values and forgets to divide {scaffold.HINT} the bug)"
args = ["--divide", "0"]

[variants.fixed]
expect = "clean"
description = "divides by the world size {scaffold.HINT} the fix, a pin or a flag)"
"""
    launch = 'launcher = "torchrun"\nprocesses = 2\ntimeout = 300'
    rule = '{ metric = "error", above = 1e-6 }'
    script = f"{name}.py"
    return {
        "repro.toml": _toml(name, script, pins, upstream, launch, rule, variants),
        script: _text("measure.py.tmpl"),
    }


def _wrapped(args: argparse.Namespace, pins: list[str]) -> dict[str, str]:
    source: Path = args.source
    if not source.is_file():
        raise BadInput(f"--from {source}: no such file")
    wrapper_name = WRAPPER if source.name != WRAPPER else OTHER_WRAPPER  # any name will do
    if not (args.fixed_with or args.fixed_args):
        raise BadInput("a repro proves itself both ways: say how the fixed variant differs "
                       "(--fixed-with PIN or --fixed-args ARGS)")  # fmt: skip
    broken = f"args = {json.dumps(shlex.split(args.broken_args))}\n" if args.broken_args else ""
    fixed = ""
    if args.fixed_args:
        fixed += f"args = {json.dumps(shlex.split(args.fixed_args))}\n"
    if args.fixed_with:
        fixed += f"pins = {json.dumps(args.fixed_with)}\n"
    variants = f"""
[variants.broken]
expect = "reproduced"
description = "{source.name} as reported"
{broken}
[variants.fixed]
expect = "clean"
description = "{source.name} where it is fixed"
{fixed}"""
    launch = 'launcher = "python"\nprocesses = 1\ntimeout = 600'
    if args.metric:
        rule = f"{{ metric = {json.dumps(args.metric)}, above = {args.above!r} }}"
    else:
        rule = '{ metric = "expected_failure", above = 0.5 }'
    wrapper = (
        _text("wrapper.py.tmpl")
        .replace("@SCRIPT@", json.dumps(source.name))
        .replace("@EXPECTED@", json.dumps(args.reproduced_if_error))
    )
    toml = _toml(args.name, wrapper_name, pins, args.upstream, launch, rule, variants, source.name)
    return {"repro.toml": toml, wrapper_name: wrapper}
