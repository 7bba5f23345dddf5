"""Expand a repro into cells: the default cell, and the matrix of variants x versions x params.

A cell is one variant at one point of the matrix, with the verdict expected there. The
release list behind a version range is injected (`versions_in_range`), so this module is pure
and its tests need no network.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from reprobox.core.errors import BadInput
from reprobox.core.protocol import Expectation, Verdict
from reprobox.core.scrub import hide_url_credentials
from reprobox.core.spec import MatrixSection, Repro, check_version

DEFAULT_CELL = "default"

# (package, range, prereleases, include_yanked) -> versions in the range, oldest first
VersionsInRange = Callable[[str, str, bool, bool], list[str]]


def is_source(value: str) -> bool:
    """Whether a package override names a source (`git+URL@REF`, a `file://` checkout or
    wheel) rather than a release version."""
    return value.startswith(("git+", "file://"))


@dataclass(frozen=True)
class Cell:
    """One variant at one matrix point on one platform, with the verdict expected there.

    Every spelling of a cell lives here: its label (for people), slug (its results folder),
    `reprobox run` arguments, nox session id and CI call_spec."""

    repro: str
    variant: str
    packages: tuple[tuple[str, str], ...] = ()  # (package, exact version) overrides
    params: tuple[tuple[str, str], ...] = ()  # (param, value) passed to the script
    expect: Expectation = Expectation.UNKNOWN
    also_ok: tuple[Verdict, ...] = ()
    platform: str = "cpu"

    @property
    def label(self) -> str:
        """`broken`, or `broken[transformers=5.24.0,model=t5]` for a matrix cell; a source
        URL's credentials never show (the label names folders and records)."""
        axes = [*self.shown_packages, *self.params]
        if not axes:
            return self.variant
        return f"{self.variant}[{','.join(f'{k}={v}' for k, v in axes)}]"

    @property
    def slug(self) -> str:
        """The results folder of the cell: platform and label as a safe directory name, so
        the same cell on cpu and gpu never shares a folder."""
        label = re.sub(r"[^A-Za-z0-9._=@,-]+", "_", self.label.replace("[", "@").rstrip("]"))
        return f"{self.platform}-{label}"

    @property
    def shown_packages(self) -> tuple[tuple[str, str], ...]:
        """The package overrides as they may be shown or stored: no `user:password@`."""
        return tuple((k, hide_url_credentials(v)) for k, v in self.packages)

    def identity(self) -> dict[str, Any]:
        """The cell as plain data, as records and job descriptions carry it (source URLs
        without their credentials; `run_args` is what still reaches them)."""
        return {
            "repro": self.repro,
            "variant": self.variant,
            "label": self.label,
            "packages": dict(self.shown_packages),
            "params": dict(self.params),
            "expect": self.expect.value,
            "also_ok": [v.value for v in self.also_ok],
        }

    @classmethod
    def from_identity(cls, data: Mapping[str, Any], platform: str = "cpu") -> Cell:
        """The inverse of `identity` (a record or a job description read back)."""
        return cls(
            repro=str(data["repro"]),
            variant=str(data["variant"]),
            packages=tuple((str(k), str(v)) for k, v in dict(data.get("packages") or {}).items()),
            params=tuple((str(k), str(v)) for k, v in dict(data.get("params") or {}).items()),
            expect=Expectation(data.get("expect") or Expectation.UNKNOWN.value),
            also_ok=tuple(Verdict(v) for v in data.get("also_ok") or ()),
            platform=platform,
        )

    def on(self, platform: str) -> Cell:
        """The same cell on another platform."""
        return replace(self, platform=platform)

    def run_args(self) -> list[str]:
        """The `reprobox run <repro>` arguments that select exactly this cell."""
        args = ["--variant", self.variant]
        for k, v in self.packages:
            if v.startswith("file://"):
                args.append(f"--with-editable={k}={v.removeprefix('file://')}")
            else:
                args.append(f"--with={k}@{v}" if is_source(v) else f"--with={k}=={v}")
        args += [f"--param={k}={v}" for k, v in self.params]
        if self.platform != "cpu":
            args += ["--platform", self.platform]
        return args

    @property
    def session_params(self) -> str:
        """How nox names the cell's parametrized session: `variant='broken', trl='0.7.1'`."""
        point = [("variant", self.variant), *self.packages, *self.params]
        return ", ".join(f"{k}={v!r}" for k, v in point)

    @property
    def session_id(self) -> str:
        """The nox session that runs exactly this cell."""
        return f"repro_{self.repro}({self.session_params})"

    def call_spec(self) -> dict[str, str]:
        """The cell's nox call_spec (what `nox --json -l` lists for CI matrices)."""
        return {
            "repro": self.repro,
            "variant": self.variant,
            **dict(self.packages),
            **dict(self.params),
        }


def script_args(repro: Repro, cell: Cell) -> list[str]:
    """The script's arguments for a cell, in protocol order (repros/README.md)."""
    variant = repro.variant(cell.variant)
    args = ["--variant", cell.variant, *variant.args]
    if variant.fix:
        args += ["--fix", variant.fix]
    for name, value in cell.params:
        args += [f"--{name}", value]
    return args


def expectation(
    repro: Repro, variant: str, packages: Mapping[str, str], params: Mapping[str, str]
) -> tuple[Expectation, tuple[Verdict, ...]]:
    """The verdict expected for `variant` at this matrix point: the first matching rule of
    [matrix] expect, else the variant's own expectation."""
    spec = repro.variant(variant)
    matrix = repro.spec.matrix
    canonical: dict[str, str] = {canonicalize_name(k): v for k, v in packages.items()}
    for rule in matrix.expect if matrix else []:
        if rule.variant not in (None, variant):
            continue
        if all(_matches(key, cond, canonical, params) for key, cond in rule.when.items()):
            return rule.expect, tuple(spec.also_ok)
    return spec.expect, tuple(spec.also_ok)


def _matches(
    key: str, condition: str, packages: Mapping[str, str], params: Mapping[str, str]
) -> bool:
    if canonicalize_name(key) in packages:
        value = packages[canonicalize_name(key)]
        # a source's version is not known here: no version rule can be said to match it
        return not is_source(value) and Version(value) in SpecifierSet(condition)
    if key in params:
        return params[key] == condition
    return False


def make_cell(
    repro: Repro,
    variant: str,
    packages: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    platform: str = "cpu",
) -> Cell:
    packages, params = dict(packages or {}), dict(params or {})
    expect, also_ok = expectation(repro, variant, packages, params)
    return Cell(
        repro=repro.name,
        variant=variant,
        packages=tuple(packages.items()),
        params=tuple(params.items()),
        expect=expect,
        also_ok=also_ok,
        platform=platform,
    )


def default_cells(
    repro: Repro, variants: Iterable[str] | None = None, platform: str = "cpu"
) -> list[Cell]:
    """The differential proof: each (default) variant at the repro's own pins."""
    names = list(variants) if variants is not None else repro.default_variants
    return [make_cell(repro, name, platform=platform) for name in names]


def requested_cells(
    repro: Repro,
    variants: Sequence[str] = (),
    packages: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    platform: str = "cpu",
    *,
    matrix: bool = False,
    versions_in_range: VersionsInRange | None = None,
) -> list[Cell]:
    """The cells a command line asks for: the whole matrix, the named variants, or (with
    versions or params but no variant) the matrix's variants at that point, else the
    default variants. Package overrides must be pins of the repro, at valid versions."""
    packages, params = dict(packages or {}), dict(params or {})
    repro.platform(platform)  # an unknown platform is an error naming the known ones
    for package, version in packages.items():
        repro.check_pinned(package, "--with")
        if not is_source(version):
            check_version(version, f"--with {package}")
    if matrix:
        return [c.on(platform) for c in matrix_cells(repro, versions_in_range)]
    if variants:
        names = list(variants)
    elif (packages or params) and repro.spec.matrix:
        names = list(repro.spec.matrix.variants)  # a matrix point: the variants it runs
    else:
        names = list(repro.default_variants)
    for name in names:
        repro.variant(name)
        if name not in repro.variants_on(platform):
            raise BadInput(f"variant {name!r} of {repro.name} does not apply on {platform}")
    return [make_cell(repro, name, packages, params, platform) for name in names]


def matrix_cells(repro: Repro, versions_in_range: VersionsInRange | None = None) -> list[Cell]:
    """Every cell of [matrix]: variants x package versions x params, minus exclusions."""
    matrix = repro.spec.matrix
    if matrix is None:
        return []
    axes = {**_package_axes(repro, matrix, versions_in_range), **matrix.params}
    package_names = set(matrix.packages)
    cells = []
    for variant in matrix.variants:
        for values in itertools.product(*axes.values()):
            point = dict(zip(axes, values, strict=True))
            if any(all(point.get(k) == v for k, v in ex.items()) for ex in matrix.exclude):
                continue
            packages = {k: v for k, v in point.items() if k in package_names}
            params = {k: v for k, v in point.items() if k not in package_names}
            cells.append(make_cell(repro, variant, packages, params))
    return cells


def _package_axes(
    repro: Repro, matrix: MatrixSection, versions_in_range: VersionsInRange | None
) -> dict[str, list[str]]:
    axes = {}
    for package, values in matrix.packages.items():
        if isinstance(values, list):
            axes[package] = values
            continue
        if versions_in_range is None:
            raise BadInput(f"{repro.name}: matrix axis {package} is a range and needs the index")
        found = versions_in_range(package, values, matrix.prereleases, matrix.include_yanked)
        if not found:
            raise BadInput(f"{repro.name}: no release of {package} matches {values!r}")
        axes[package] = found
    return axes
