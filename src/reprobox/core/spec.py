"""Load and validate `repros/<name>/repro.toml`, the single source of truth of a repro.

Shape checks are declared with pydantic in `spec_schema` (types, allowed values, unknown
keys); the checks that need the file system or packaging rules (script exists, fix module
exists, pins parse) follow in `check_semantics`, with the field rules of `spec_rules`. Every
error names the file and the field.

Numbers and booleans are strict (a quoted `"180"` is refused, not coerced), timeouts are
finite and positive, names that become folders are slugs, and every path stays inside the
repro's folder (or `fixes/`): a repro.toml from a pull request cannot point the harness at
files elsewhere on the machine.
"""

from __future__ import annotations

import math
import tomllib
import types
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn, Union, get_args, get_origin

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ValidationError

from reprobox.core import suggest
from reprobox.core.errors import BadInput, SpecError
from reprobox.core.instants import exclude_newer_problem
from reprobox.core.spec_rules import (
    MODULE_NAME,
    RESERVED_VARIANT_NAMES,
    SLUG,
    Fail,
    check_pins,
    check_version_at,
    display,
    inside,
)

# the file's shape (spec_schema); names other modules reach through spec stay here
# the file's shape lives in spec_schema; the names other modules reach as spec.X stay
from reprobox.core.spec_schema import (
    MAX_NODES as MAX_NODES,
)
from reprobox.core.spec_schema import (
    SPEC_FILE as SPEC_FILE,
)
from reprobox.core.spec_schema import (
    BisectSection as BisectSection,
)
from reprobox.core.spec_schema import (
    LaunchSection as LaunchSection,
)
from reprobox.core.spec_schema import (
    MatrixSection as MatrixSection,
)
from reprobox.core.spec_schema import (
    PlatformSection as PlatformSection,
)
from reprobox.core.spec_schema import (
    ReproFile as ReproFile,
)
from reprobox.core.spec_schema import (
    Rule as Rule,
)
from reprobox.core.spec_schema import (
    TruthSection as TruthSection,
)
from reprobox.core.spec_schema import (
    Variant as Variant,
)
from reprobox.core.spec_schema import (
    VerdictSection as VerdictSection,
)


@dataclass(frozen=True)
class Repro:
    """A validated repro: its parsed file plus where it lives."""

    name: str
    dir: Path
    spec: ReproFile
    fixes_dir: Path

    @property
    def file(self) -> Path:
        return self.dir / SPEC_FILE

    @property
    def script(self) -> Path:
        return self.dir / self.spec.repro.script

    @property
    def corpus(self) -> bool:
        """A corpus repro (it has a `[truth]`): run by `nox -t corpus`, not `make repro`."""
        return self.spec.truth is not None

    @cached_property
    def default_variants(self) -> list[str]:
        return [name for name, v in self.spec.variants.items() if v.default]

    def variant(self, name: str) -> Variant:
        try:
            return self.spec.variants[name]
        except KeyError:
            raise BadInput(
                f"repro {self.name!r} has no variant {name!r}"
                + suggest.hint(name, self.spec.variants, "it has")
            ) from None

    def rules(self, variant: str) -> list[Rule]:
        """The verdict rule of a variant: its own, else the repro's."""
        return list(self.verdict(variant).reproduced_if)

    def verdict(self, variant: str) -> VerdictSection:
        """The [verdict] of a variant: its own, else the repro's."""
        return self.variant(variant).verdict or self.spec.verdict

    def noisy(self, variant: str) -> bool:
        """Whether the variant's outcome is declared noisy (`[verdict] repeats`): judged from
        repeated launches, bisected with the flake-aware search."""
        return self.verdict(variant).repeats is not None

    def launch(self, variant: str) -> LaunchSection:
        """[launch] with the variant's overrides applied."""
        override = self.variant(variant).launch
        if override is None:
            return self.spec.launch
        changes = override.model_dump(exclude_none=True)
        return self.spec.launch.model_copy(update=changes)

    def requirements(
        self, variant: str, platform: str = "cpu", overrides: dict[str, str] | None = None
    ) -> list[str]:
        """The pins a variant installs: [env], then the platform's, the variant's, and
        `overrides` (package -> exact version, from a matrix cell or a bisect probe)."""
        pins = merge_pins(self.spec.env.pins, self.platform(platform).pins)
        pins = merge_pins(pins, self.variant(variant).pins)
        extra = [f"{name}=={version}" for name, version in (overrides or {}).items()]
        return merge_pins(pins, extra)

    def python(self, platform: str = "cpu") -> str:
        return self.platform(platform).python or self.spec.env.python

    def install_env(self, platform: str = "cpu") -> dict[str, str]:
        return {**self.spec.env.install_env, **self.platform(platform).install_env}

    def variants_on(self, platform: str) -> list[str]:
        """The variants that apply on `platform`."""
        return [
            name
            for name, v in self.spec.variants.items()
            if v.platforms is None or platform in v.platforms
        ]

    def platform(self, platform: str) -> PlatformSection:
        if platform == "cpu" and "cpu" not in self.spec.platforms:
            return PlatformSection()
        try:
            return self.spec.platforms[platform]
        except KeyError:
            known = ", ".join(["cpu", *self.spec.platforms]) if self.spec.platforms else "cpu"
            raise BadInput(
                f"repro {self.name!r} has no platform {platform!r}; it has: {known}"
            ) from None

    def pinned_packages(self) -> set[str]:
        return {canonicalize_name(Requirement(p).name) for p in self.spec.env.pins}

    def check_pinned(self, package: str, flag: str) -> str:
        """`package`'s canonical name; BadInput naming `flag` and the closest pin when the
        repro does not pin it (every flag that names a package: --with, --package, --float)."""
        pinned = self.pinned_packages()
        name = canonicalize_name(package)
        if name not in pinned:
            raise BadInput(
                f"{flag} {package}: not a package that {self.name} pins"
                + suggest.hint(package, sorted(pinned), "it pins")
            )
        return name


def merge_pins(base: list[str], replacements: list[str]) -> list[str]:
    """Replace requirements of the same (canonical) package; append new ones."""
    merged = {canonicalize_name(Requirement(p).name): p for p in base}
    for pin in replacements:
        merged[canonicalize_name(Requirement(pin).name)] = pin
    return list(merged.values())


def discover(root: Path) -> list[str]:
    """Names of the repros under `root/repros` (directories holding a repro.toml)."""
    repros = root / "repros"
    if not repros.is_dir():
        return []
    return sorted(
        p.name
        for p in repros.iterdir()
        if p.is_dir() and not p.name.startswith(("_", ".")) and (p / SPEC_FILE).is_file()
    )


def load(root: Path, name: str) -> Repro:
    """Load one repro by name, with a helpful error for unknown names."""
    known = discover(root)
    if name not in known:
        raise BadInput(f"unknown repro {name!r}{suggest.hint(name, known)}")
    return load_file(root / "repros" / name / SPEC_FILE, fixes_dir=root / "fixes")


def load_file(file: Path, fixes_dir: Path) -> Repro:
    shown = display(file)
    try:
        raw = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise SpecError(shown, "", "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(shown, "", f"not valid TOML: {exc}") from None
    try:
        spec = ReproFile.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key also makes its field "missing": name the unknown key, which is
        # the one the user has to fix.
        unknown = [e for e in errors if e["type"] == "extra_forbidden"]
        first = (unknown or errors)[0]
        field = ".".join(str(part) for part in first["loc"])
        extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SpecError(shown, field, f"{_pydantic_message(first)}{extra}") from None
    repro = Repro(name=file.parent.name, dir=file.parent, spec=spec, fixes_dir=fixes_dir)
    check_semantics(repro, shown)
    return repro


def check_semantics(repro: Repro, shown: str) -> None:
    spec = repro.spec

    def fail(field: str, problem: str) -> NoReturn:
        raise SpecError(shown, field, problem)

    if not inside(repro.dir, spec.repro.script):
        fail("repro.script", f"{spec.repro.script!r} is outside the repro's folder")
    if not repro.script.is_file():
        fail("repro.script", f"script {spec.repro.script!r} not found in {display(repro.dir)}")
    by_hand = spec.repro.by_hand
    if by_hand and not (inside(repro.dir, by_hand) and (repro.dir / by_hand).is_file()):
        fail("repro.by_hand", f"script {by_hand!r} not found in {display(repro.dir)}")
    check_pins(spec.env.pins, "env.pins", fail)
    if spec.env.exclude_newer is not None and (
        why := exclude_newer_problem(spec.env.exclude_newer)
    ):
        fail("env.exclude_newer", why)
    for name, platform in spec.platforms.items():
        if not SLUG.match(name):
            fail(f"platforms.{name}", _NOT_A_SLUG)
        check_pins(platform.pins, f"platforms.{name}.pins", fail)
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
    if spec.launch.fork and spec.launch.launcher != "python":
        # torchrun forks with its own `--start_method fork`; accelerate has no such start.
        # A variant that only changes the launcher leaves the repro's `fork` unused.
        fail("launch.fork", f"only the python launcher forks its ranks, not {spec.launch.launcher}")
    _check_repeats(spec.verdict, "verdict", fail)

    for name, variant in spec.variants.items():
        where = f"variants.{name}"
        if variant.verdict is not None:
            _check_repeats(variant.verdict, f"{where}.verdict", fail)
        if not SLUG.match(name):
            fail(where, _NOT_A_SLUG)
        if name in RESERVED_VARIANT_NAMES:
            fail(where, f"{name!r} is reserved (it names the default cell)")
        check_pins(variant.pins, f"{where}.pins", fail)
        if variant.fix is not None:
            if not MODULE_NAME.match(variant.fix) or not inside(
                repro.fixes_dir, f"{variant.fix}.py"
            ):
                fail(f"{where}.fix", f"{variant.fix!r} is not a module name in fixes/")
            if not (repro.fixes_dir / f"{variant.fix}.py").is_file():
                fail(f"{where}.fix", f"fix module {variant.fix!r} not found in fixes/")
        if variant.launch is not None:
            _check_launch(repro, repro.launch(name), f"{where}.launch", fail)
            if variant.launch.fork and repro.launch(name).launcher != "python":
                fail(f"{where}.launch.fork", "only the python launcher forks its ranks")
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
                check_version_at(value, f"bisect.{end}", fail)


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
        if not inside(repro.dir, launch.config):
            fail(f"{where}.config", f"{launch.config!r} is outside the repro's folder")
        if not (repro.dir / launch.config).is_file():
            fail(f"{where}.config", f"config {launch.config!r} not found")


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
                check_version_at(value, f"{where}[{index}]", fail)
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


def _pydantic_message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        known = list(getattr(_model_at(error["loc"][:-1]), "model_fields", {}))
        found = suggest.close_match(str(error["loc"][-1]), known)
        return "unknown field" + (f" (did you mean {found!r}?)" if found else "")
    if error["type"] == "missing":
        return "required field is missing"
    value = error.get("input")
    shown = f" (got {value!r})" if isinstance(value, str | int | float | bool) else ""
    return f"{error['msg']}{shown}"


def _model_at(loc: Iterable[int | str]) -> type[BaseModel] | None:
    """The section model at a pydantic error location (`variants.x.launch` is a
    LaunchOverride), so an unknown key can be compared with the fields it may have meant."""
    kind: Any = ReproFile
    for part in loc:
        kind = _model_in(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(str(part))
            if field is None:
                return None
            kind = field.annotation
        elif get_origin(kind) is dict:
            kind = get_args(kind)[1]
        elif get_origin(kind) is list:
            kind = get_args(kind)[0]
        else:
            return None
    kind = _model_in(kind)
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _model_in(kind: Any) -> Any:
    """`Model | None` -> Model; anything else unchanged."""
    if get_origin(kind) in (Union, types.UnionType):
        for member in get_args(kind):
            if isinstance(member, type) and issubclass(member, BaseModel):
                return member
    return kind


def check_timeout(value: float | None, what: str) -> float | None:
    """Raise BadInput unless `value` is a finite number of seconds above zero (None: unset).

    `nan` would disable the timeout, `inf` too, and 0 or less would kill every launch (or
    be ignored as false): each is a typo, not a wish."""
    if value is None:
        return None
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{what}: {value!r} is not a timeout; give a finite number of seconds > 0")
    return float(value)


def check_overrides(items: Iterable[str], what: str = "--with") -> None:
    """Raise BadInput when one package is given twice (`--with numpy==1.26.0 --with
    NumPy==1.25.0`): only one of them could win, silently."""
    seen: dict[str, str] = {}
    for item in items:
        name = item.partition("==")[0].strip()
        if not name:
            continue
        try:
            key = canonicalize_name(Requirement(name).name)
        except InvalidRequirement:
            continue  # malformed: the parser of the values says so
        if key in seen:
            raise BadInput(f"{what}: {key} given twice ({seen[key]!r} and {item!r})")
        seen[key] = item


def check_version(value: str, what: str) -> None:
    """Raise BadInput unless `value` is a valid (PEP 440) version."""
    try:
        Version(value)
    except InvalidVersion:
        raise BadInput(f"{what}: {value!r} is not a valid version") from None
