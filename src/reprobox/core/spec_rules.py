"""The field rules of a repro.toml that its schema cannot state, each on plain values (no
model, so this module imports nothing of the spec): paths stay inside the repro's folder,
pins and versions parse, names are slugs; and how a file is named in errors.
`spec.check_semantics` walks the parsed file with them (the script and fixes exist, the
matrix and bisect name what the repro defines)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from reprobox.core.errors import BadInput

RESERVED_VARIANT_NAMES = {"default"}
# Names that become folder, lock-file and nox-session names (variants, platforms).
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# A fix is a module imported from fixes/ by name.
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def inside(base: Path, relative: str) -> bool:
    """Whether `relative` names a path inside `base` (no absolute path, no `..` or symlink
    leading out)."""
    if Path(relative).is_absolute():
        return False
    return (base / relative).resolve().is_relative_to(base.resolve())


# Reports a problem with a field and stops (raises SpecError).
Fail = Callable[[str, str], NoReturn]


def check_pins(pins: list[str], where: str, fail: Fail) -> None:
    for index, pin in enumerate(pins):
        try:
            Requirement(pin)
        except InvalidRequirement as exc:
            fail(f"{where}[{index}]", f"bad requirement {pin!r}: {exc}")


def check_version_at(value: str, where: str, fail: Fail) -> None:
    try:
        Version(value)
    except InvalidVersion:
        fail(where, f"{value!r} is not a valid version")


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def refuse_nodes(nodes: int) -> None:
    """A back end that runs one machine refuses a launch over nodes: N x P ranks on one
    machine would measure another world size, and a launch short of its nodes another bug."""
    if nodes > 1:
        raise BadInput(
            f"[launch] nodes = {nodes} spans nodes: run it with --backend slurm (this back "
            "end runs one machine)"
        )
