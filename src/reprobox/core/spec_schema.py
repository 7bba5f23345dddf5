"""The shape of `repro.toml`: its sections as strict pydantic models (types, allowed values,
unknown keys refused, strict numbers and booleans), and the field rules a single value can
be checked by. `core.spec` loads a file into these models and adds the checks that need the
repro's folder, the file system or other sections (`check_semantics`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reprobox.core.protocol import Expectation, Verdict

SPEC_FILE = "repro.toml"
# Launching more ranks than this on one host is a typo, not a repro.
MAX_PROCESSES = 64
MAX_NODES = 64

# Strict: TOML has real numbers and booleans, so a quoted one is a mistake to report.
Processes = Annotated[int, Field(ge=1, le=MAX_PROCESSES, strict=True)]
Nodes = Annotated[int, Field(ge=1, le=MAX_NODES, strict=True)]
Seconds = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]


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
    # (core.env_filter); nothing else of it reaches them.
    pass_env: list[EnvName] = []
    # Nodes of one launch (Slurm: one task per node); `processes` is ranks per node.
    nodes: Nodes = 1
    # The python launcher's warm start: these modules are imported once, then the ranks
    # are forked from that interpreter (repros/README.md, "Warm start"); empty: cold ranks.
    fork: list[ModuleName] = []


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
    fork: list[ModuleName] | None = None


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
DEFAULT_BUDGET_SPRT = 20  # repeats = "auto" without a budget (core.repeat_verdict: why)
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
    # None: the bug was born with the feature it breaks, so no earlier release can run the
    # check (it cannot test there); then only the fix edge is a question
    last_good: str | None = None
    first_bad: str
    first_fixed: str | None = None  # None: not fixed in any release yet
    # the last release before first_fixed that still reproduces: for a noisy case (each
    # release costs tens of launches) the corpus sweeps each edge alone, not the whole range
    last_bad: str | None = None
    # the upstream issue was still open when the edges were verified, and `broken` runs at
    # the newest releases: the nightly canary watches for the release that fixes it
    open: bool = False
    # the package the user reported the bug against, when the culprit is another one
    reported_in: str | None = None
    symptom: Literal["metric", "exception", "value"]
    verified: str = Field(min_length=1)  # how the edges were verified: the command, the date

    @field_validator("last_good", "first_bad", "first_fixed", "last_bad")
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
        if self.last_bad is not None:
            last_bad = Version(self.last_bad)
            if self.first_fixed is None:
                raise ValueError("last_bad is the release before the fix: give first_fixed")
            if not Version(self.first_bad) <= last_bad < Version(self.first_fixed):
                raise ValueError("first_bad <= last_bad < first_fixed must hold")
        if self.open and self.first_fixed is not None:
            raise ValueError("open = true says no release fixed it: leave first_fixed out")

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
