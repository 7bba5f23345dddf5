"""The rules a repro.toml must keep that its schema cannot state (spec.py declares the
shape): paths stay inside the repro's folder, the script and fixes exist, pins and version
ranges parse, names are slugs, the matrix and bisect name what the repro defines."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from reprobox.core.errors import BadInput, SpecError
from reprobox.core.instants import exclude_newer_problem

if TYPE_CHECKING:
    from reprobox.core.spec import LaunchSection, MatrixSection, Repro, VerdictSection

RESERVED_VARIANT_NAMES = {"default"}
# Names that become folder, lock-file and nox-session names (variants, platforms).
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# A fix is a module imported from fixes/ by name.
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _inside(base: Path, relative: str) -> bool:
    """Whether `relative` names a path inside `base` (no absolute path, no `..` or symlink
    leading out)."""
    if Path(relative).is_absolute():
        return False
    return (base / relative).resolve().is_relative_to(base.resolve())


# Reports a problem with a field and stops (raises SpecError).
Fail = Callable[[str, str], NoReturn]


def check_semantics(repro: Repro, shown: str) -> None:
    spec = repro.spec

    def fail(field: str, problem: str) -> NoReturn:
        raise SpecError(shown, field, problem)

    if not _inside(repro.dir, spec.repro.script):
        fail("repro.script", f"{spec.repro.script!r} is outside the repro's folder")
    if not repro.script.is_file():
        fail("repro.script", f"script {spec.repro.script!r} not found in {display(repro.dir)}")
    by_hand = spec.repro.by_hand
    if by_hand and not (_inside(repro.dir, by_hand) and (repro.dir / by_hand).is_file()):
        fail("repro.by_hand", f"script {by_hand!r} not found in {display(repro.dir)}")
    _check_pins(spec.env.pins, "env.pins", fail)
    if spec.env.exclude_newer is not None and (
        why := exclude_newer_problem(spec.env.exclude_newer)
    ):
        fail("env.exclude_newer", why)
    for name, platform in spec.platforms.items():
        if not SLUG.match(name):
            fail(f"platforms.{name}", _NOT_A_SLUG)
        _check_pins(platform.pins, f"platforms.{name}.pins", fail)
        if platform.ranks_per_gpu > 1 and platform.backend == "nccl":
            fail(
                f"platforms.{name}.ranks_per_gpu",
                'NCCL refuses two ranks on one GPU; set backend = "gloo" to share GPUs',
            )
        ranges = {f"platforms.{name}.host_torch": platform.host_torch} | {
            f"platforms.{name}.host_packages.{package}": wanted
            for package, wanted in platform.host_packages.items()
        }
        for where, wanted in ranges.items():
            if wanted is None:
                continue
            try:
                if not wanted.strip():  # "" would accept any version, silently
                    raise InvalidSpecifier(wanted)
                SpecifierSet(wanted)
            except InvalidSpecifier:
                fail(where, f'{wanted!r} is not a version range (e.g. ">=2.1")')
        if platform.host_packages and platform.host_torch is None:
            fail(f"platforms.{name}.host_packages", "goes with host_torch (the host's torch)")
        if "torch" in {canonicalize_name(p) for p in platform.host_packages}:
            fail(f"platforms.{name}.host_packages", "torch's range is host_torch")
    _check_launch(repro, spec.launch, "launch", fail)
    _check_repeats(spec.verdict, "verdict", fail)

    for name, variant in spec.variants.items():
        where = f"variants.{name}"
        if variant.verdict is not None:
            _check_repeats(variant.verdict, f"{where}.verdict", fail)
        if not SLUG.match(name):
            fail(where, _NOT_A_SLUG)
        if name in RESERVED_VARIANT_NAMES:
            fail(where, f"{name!r} is reserved (it names the default cell)")
        _check_pins(variant.pins, f"{where}.pins", fail)
        if variant.fix is not None:
            if not MODULE_NAME.match(variant.fix) or not _inside(
                repro.fixes_dir, f"{variant.fix}.py"
            ):
                fail(f"{where}.fix", f"{variant.fix!r} is not a module name in fixes/")
            if not (repro.fixes_dir / f"{variant.fix}.py").is_file():
                fail(f"{where}.fix", f"fix module {variant.fix!r} not found in fixes/")
        if variant.launch is not None:
            _check_launch(repro, repro.launch(name), f"{where}.launch", fail)
        for index, wanted in enumerate(variant.platforms or []):
            if wanted != "cpu" and wanted not in spec.platforms:
                fail(f"{where}.platforms[{index}]", f"no platform {wanted!r} in [platforms]")

    if spec.matrix is not None:
        _check_matrix(repro, spec.matrix, fail)
    if spec.bisect is not None:
        if spec.bisect.variant not in spec.variants:
            fail("bisect.variant", f"no variant {spec.bisect.variant!r}")
        if canonicalize_name(spec.bisect.package) not in repro.pinned_packages():
            fail("bisect.package", f"{spec.bisect.package!r} is not among env.pins")
        for end in ("good", "bad"):
            value = getattr(spec.bisect, end)
            if value is not None:
                _check_version(value, f"bisect.{end}", fail)


_NOT_A_SLUG = (
    "not a valid name: letters, digits, '_' and '-', starting with a letter or digit, "
    "at most 64 characters (it names folders and nox sessions)"
)


def _check_repeats(verdict: VerdictSection, where: str, fail: Fail) -> None:
    """A statistical verdict names what it tests: a metric test its metric and the value it
    is held against; pass/fail rates that fit in [0, 1]; enough launches for a t-test."""
    if verdict.test == "sprt":
        for name in ("metric", "threshold"):
            if getattr(verdict, name) is not None:
                fail(f"{where}.{name}", 'only a metric test (test = "t" or "sign") reads it')
        effect = 0.5 if verdict.effect is None else verdict.effect
        if not 0 < effect <= 1 - verdict.floor:
            fail(f"{where}.effect", f"floor + effect must lie in (floor, 1]; got {effect:g}")
        return
    if verdict.metric is None:
        fail(f"{where}.metric", f"test = {verdict.test!r} needs the metric it tests")
    if verdict.threshold is None:
        fail(
            f"{where}.threshold",
            f"test = {verdict.test!r} holds {verdict.metric!r}'s samples against a value: set "
            "threshold (the metric's value without the bug; a rule's `above` is a cut for one "
            "launch, not that mean)",
        )
    if verdict.repeats is None:
        fail(f"{where}.repeats", f"test = {verdict.test!r} reads repeated launches: set repeats")
    if verdict.repeats == "auto" and not verdict.effect:
        fail(
            f"{where}.effect",
            'repeats = "auto" plans its launches from the smallest shift that matters: set '
            "effect above 0",
        )
    if verdict.test == "t" and verdict.most < 2:
        fail(f"{where}.repeats", "a t-test needs at least two launches")


def _check_launch(repro: Repro, launch: LaunchSection, where: str, fail: Fail) -> None:
    if launch.config is not None:
        if launch.launcher != "accelerate":
            fail(f"{where}.config", "only the accelerate launcher takes a config file")
        if not _inside(repro.dir, launch.config):
            fail(f"{where}.config", f"{launch.config!r} is outside the repro's folder")
        if not (repro.dir / launch.config).is_file():
            fail(f"{where}.config", f"config {launch.config!r} not found")


def _check_pins(pins: list[str], where: str, fail: Fail) -> None:
    for index, pin in enumerate(pins):
        try:
            Requirement(pin)
        except InvalidRequirement as exc:
            fail(f"{where}[{index}]", f"bad requirement {pin!r}: {exc}")


def _check_version(value: str, where: str, fail: Fail) -> None:
    try:
        Version(value)
    except InvalidVersion:
        fail(where, f"{value!r} is not a valid version")


def _check_matrix(repro: Repro, matrix: MatrixSection, fail: Fail) -> None:
    for index, variant in enumerate(matrix.variants):
        if variant not in repro.spec.variants:
            fail(f"matrix.variants[{index}]", f"no variant {variant!r}")
    pinned = repro.pinned_packages()
    for package, values in matrix.packages.items():
        where = f"matrix.packages.{package}"
        if canonicalize_name(package) not in pinned:
            fail(where, f"{package!r} is not among env.pins")
        if isinstance(values, str):
            try:
                SpecifierSet(values)
            except InvalidSpecifier:
                fail(where, f"{values!r} is neither a list of versions nor a version range")
        else:
            for index, value in enumerate(values):
                _check_version(value, f"{where}[{index}]", fail)
    overlap = set(matrix.packages) & set(matrix.params)
    if overlap:
        fail("matrix.params", f"{sorted(overlap)} named both as package and as param axis")
    axes = set(matrix.packages) | set(matrix.params)
    for index, rule in enumerate(matrix.expect):
        for key, value in rule.when.items():
            if key not in axes:
                fail(f"matrix.expect[{index}].when.{key}", "not a matrix axis")
            if key in matrix.packages:
                try:
                    SpecifierSet(value)
                except InvalidSpecifier:
                    fail(f"matrix.expect[{index}].when.{key}", f"bad version range {value!r}")
        if rule.variant is not None and rule.variant not in repro.spec.variants:
            fail(f"matrix.expect[{index}].variant", f"no variant {rule.variant!r}")
    for index, exclusion in enumerate(matrix.exclude):
        for key in exclusion:
            if key not in axes:
                fail(f"matrix.exclude[{index}].{key}", "not a matrix axis")


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
