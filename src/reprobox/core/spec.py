"""Load and validate `repros/<name>/repro.toml`, the single source of truth of a repro.

Shape checks are declared with pydantic (types, allowed values, unknown keys); the checks
that need the file system or packaging rules (script exists, fix module exists, pins parse)
follow in `check_semantics`, with the field rules of `spec_rules`. Every error names the file
and the field.

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
from typing import Annotated, Any, Literal, NoReturn, Union, get_args, get_origin

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reprobox.core import suggest
from reprobox.core.errors import BadInput, SpecError
from reprobox.core.instants import exclude_newer_problem
from reprobox.core.protocol import Expectation, Verdict
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

SPEC_FILE = "repro.toml"
# Launching more ranks than this on one host is a typo, not a repro.
MAX_PROCESSES = 64
MAX_NODES = 64

# Strict: TOML has real numbers and booleans, so a quoted one is a mistake to report.
Processes = Annotated[int, Field(ge=1, le=MAX_PROCESSES, strict=True)]
Nodes = Annotated[int, Field(ge=1, le=MAX_NODES, strict=True)]
Seconds = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReproSection(_Section):
    title: str = Field(min_length=1)
    upstream: str = Field(min_length=1)
    fix_links: list[str] = []
    script: str = Field(min_length=1)
    # The script a person runs, when `script` only wraps it for the harness (`reprobox new
    # --from bug.py`): a report's reproduction shows `python bug.py ARGS`, not the wrapper.
    by_hand: str = ""
    # What should happen instead (the "Expected behavior" of upstream bug forms).
    expected: str = ""


Launcher = Literal["torchrun", "accelerate", "python"]


class LaunchSection(_Section):
    launcher: Launcher
    processes: Processes
    timeout: Seconds
    args: list[str] = []
    config: str | None = None
    env: dict[str, str] = {}
    # Variants with the same environment and launch settings may share one launch; the
    # script then reads a plan of cases (repros/README.md, "Batching").
    batch: bool = Field(default=False, strict=True)
    # Script arguments for a one-process check before launching (repros/README.md, "Preflight").
    preflight: list[str] | None = None
    # Variables of the harness's environment the ranks get beyond the stack's own set
    # (core.environ); nothing else of it reaches them.
    pass_env: list[EnvName] = []
    # Nodes of one launch (Slurm: one task per node); `processes` is ranks per node.
    nodes: Nodes = 1


class LaunchOverride(_Section):
    """A variant's changes to [launch]; unset fields keep the repro's value."""

    launcher: Launcher | None = None
    processes: Processes | None = None
    timeout: Seconds | None = None
    args: list[str] | None = None
    config: str | None = None
    env: dict[str, str] | None = None
    preflight: list[str] | None = None
    pass_env: list[EnvName] | None = None
    nodes: Nodes | None = None


class EnvSection(_Section):
    python: str = "3.11"
    pins: list[str] = Field(min_length=1)
    exclude_newer: str | None = None
    install_env: dict[str, str] = {}
    # Built from source against the environment (their setup imports torch, say): last.
    no_build_isolation: list[str] = []


class Rule(_Section):
    metric: str
    above: float = Field(strict=True, allow_inf_nan=False)


Probability = Annotated[float, Field(gt=0, lt=0.5, strict=True)]
Launches = Annotated[int, Field(ge=1, le=1000, strict=True)]
DEFAULT_BUDGET_SPRT = 20  # repeats = "auto" without a budget (core.repeated: why)
DEFAULT_BUDGET_METRIC = 200


class VerdictSection(_Section):
    """How a launch's result becomes a verdict; with `repeats`, how many launches do.

    A noisy outcome (`repeats`, docs in repros/README.md, "Noisy outcomes") is judged from
    repeated launches with a stated test: "sprt" reads each launch's verdict (pass/fail);
    "t" and "sign" read `metric` against `threshold`, which has no default: the rule's
    `above` is a cut for one launch, not the mean a change is measured from."""

    reproduced_if: list[Rule] = Field(min_length=1)
    repeats: Launches | Literal["auto"] | None = None  # None: one launch, as always
    test: Literal["sprt", "t", "sign"] = "sprt"
    metric: str | None = None  # t / sign: the metric whose samples are tested
    threshold: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    alpha: Probability = 0.01  # the chance of calling a clean cell reproduced
    # sprt: the chance of calling a reproducing cell clean; t ("auto"): the chance that
    # launches planned for a mean `effect` away from `threshold` leave it undecided
    beta: Probability = 0.01
    # the smallest effect that matters: sprt, the reproduction rate above `floor` (default
    # 0.5); t / sign, the excess over `threshold` (default 0)
    effect: float | None = Field(default=None, ge=0, strict=True, allow_inf_nan=False)
    floor: float = Field(default=0.0, ge=0, lt=1, strict=True)  # sprt: a clean cell's rate
    # repeats = "auto": the most launches (default `default_budget`)
    budget: Launches | None = None
    seed: int | None = Field(default=None, ge=0, strict=True)  # REPRO_SEED of the first launch

    @property
    def most(self) -> int:
        """The most launches a cell may take: `repeats`, or for "auto" the budget (default:
        20 for sprt, whose test stops as soon as it decides; 200 for a metric test, enough
        to tell a shift of half a standard deviation at the default alpha and beta)."""
        if self.repeats != "auto":
            return int(self.repeats or 1)
        if self.budget is not None:
            return self.budget
        return DEFAULT_BUDGET_SPRT if self.test == "sprt" else DEFAULT_BUDGET_METRIC

    @field_validator("repeats", mode="before")
    @classmethod
    def _repeats(cls, value: object) -> object:
        """One plain message for what is neither a number of launches nor "auto"."""
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
            raise ValueError(f'give a number of launches (1 to 1000) or "auto"; got {value!r}')
        return value


class Variant(_Section):
    expect: Expectation
    also_ok: list[Verdict] = []
    description: str = ""
    args: list[str] = []
    fix: str | None = None
    pins: list[str] = []
    launch: LaunchOverride | None = None
    default: bool = Field(default=True, strict=True)
    # Replaces [verdict] for this variant, e.g. where a newer API measures another way.
    verdict: VerdictSection | None = None
    platforms: list[str] | None = None  # where the variant applies (default: everywhere)


class ExpectRule(_Section):
    when: dict[str, str]
    variant: str | None = None
    expect: Expectation


class MatrixSection(_Section):
    variants: list[str] = Field(min_length=1)
    packages: dict[str, list[str] | str] = {}
    params: dict[str, list[str]] = {}
    exclude: list[dict[str, str]] = []
    expect: list[ExpectRule] = []
    prereleases: bool = Field(default=False, strict=True)
    include_yanked: bool = Field(default=False, strict=True)


class BisectSection(_Section):
    package: str
    variant: str
    good: str | None = None
    bad: str | None = None
    float: list[str] = []  # packages a date bisection resolves by date (default: package)


class PlatformSection(_Section):
    python: str | None = None
    pins: list[str] = []
    install_env: dict[str, str] = {}
    # GPU hosts (run/devices.py): ranks that may share one GPU (NCCL refuses two: 1 unless
    # the script's collectives run over gloo, `backend = "gloo"`).
    ranks_per_gpu: int = Field(default=1, ge=1, le=MAX_PROCESSES, strict=True)
    backend: Literal["nccl", "gloo"] = "nccl"
    # The host torch versions the repro accepts where torch comes from the host
    # (REPROBOX_TORCH_SOURCE=host): a version range such as ">=2.1" (a packaging SpecifierSet).
    host_torch: str | None = None
    # More packages taken from the host with its torch, each with the versions accepted
    # (`{ pyarrow = ">=15" }`): what a cluster image ships beside torch and a lock would
    # otherwise bring again (a wheelhouse for an offline node), dropped from the host flavour.
    host_packages: dict[str, str] = {}

    @property
    def host_torch_range(self) -> SpecifierSet | None:
        """`host_torch` parsed (validated at load, so it parses)."""
        return SpecifierSet(self.host_torch) if self.host_torch is not None else None

    @property
    def host_package_ranges(self) -> dict[str, SpecifierSet]:
        """`host_packages` parsed, by canonical name (validated at load)."""
        return {
            str(canonicalize_name(name)): SpecifierSet(wanted)
            for name, wanted in sorted(self.host_packages.items())
        }


class ImageSection(_Section):
    """Settings of the repro's generated Dockerfile (src/reprobox/run/dockerfile.py)."""

    base: str = "python:3.11-slim"
    # torch wheels bring their own CUDA libraries; a -devel base is for JIT-built ops.
    gpu_base: str = "nvidia/cuda:12.4.1-base-ubuntu22.04"
    system_packages: list[str] = []  # Debian/Ubuntu packages, in both targets


class TruthSection(_Section):
    """What really happened upstream, verified by running every release around each edge: a
    corpus repro's answer key (`nox -s corpus` holds reprobox's answers against it)."""

    package: str = Field(min_length=1)  # the package whose releases hold the edges
    last_good: str
    first_bad: str
    first_fixed: str | None = None  # None: not fixed in any release yet
    # the package the user reported the bug against, when the culprit is another one
    reported_in: str | None = None
    symptom: Literal["metric", "exception", "value"]
    verified: str = Field(min_length=1)  # how the edges were verified: the command, the date

    @field_validator("last_good", "first_bad", "first_fixed")
    @classmethod
    def _a_release(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Version(value)
            except InvalidVersion:
                raise ValueError(f"{value!r} is not a release version") from None
        return value

    def model_post_init(self, context: Any, /) -> None:
        edges = [Version(v) for v in (self.last_good, self.first_bad, self.first_fixed) if v]
        if edges != sorted(set(edges)):
            raise ValueError("last_good < first_bad < first_fixed must hold")

    @property
    def cross_package(self) -> bool:
        """Whether the culprit is another package than the one the bug was reported in."""
        reported = self.reported_in
        return reported is not None and canonicalize_name(reported) != canonicalize_name(
            self.package
        )


class ReproFile(_Section):
    repro: ReproSection
    launch: LaunchSection
    env: EnvSection
    verdict: VerdictSection
    variants: dict[str, Variant] = Field(min_length=1)
    matrix: MatrixSection | None = None
    bisect: BisectSection | None = None
    platforms: dict[str, PlatformSection] = {}
    image: ImageSection = ImageSection()
    truth: TruthSection | None = None  # a corpus repro's verified edges


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
