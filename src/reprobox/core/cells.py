"""Expand a repro into cells: the default cell, and the matrix of variants x versions x params.

A cell is one variant at one point of the matrix, with the verdict expected there. The
release list behind a version range is injected (`versions_in_range`), so this module is pure
and its tests need no network.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from reprobox.core.errors import BadInput
from reprobox.core.protocol import Expectation, Verdict
from reprobox.core.spec import MatrixSection, Repro

DEFAULT_CELL = "default"

# (package, range, prereleases, include_yanked) -> versions in the range, oldest first
VersionsInRange = Callable[[str, str, bool, bool], list[str]]


@dataclass(frozen=True)
class Cell:
    repro: str
    variant: str
    packages: tuple[tuple[str, str], ...] = ()  # (package, exact version) overrides
    params: tuple[tuple[str, str], ...] = ()  # (param, value) passed to the script
    expect: Expectation = Expectation.UNKNOWN
    also_ok: tuple[Verdict, ...] = ()

    @property
    def label(self) -> str:
        """`broken`, or `broken[transformers=5.24.0,model=t5]` for a matrix cell."""
        axes = [*self.packages, *self.params]
        if not axes:
            return self.variant
        return f"{self.variant}[{','.join(f'{k}={v}' for k, v in axes)}]"

    @property
    def slug(self) -> str:
        """The label as a safe directory name."""
        return re.sub(r"[^A-Za-z0-9._=@,-]+", "_", self.label.replace("[", "@").rstrip("]"))

    def identity(self) -> dict[str, Any]:
        """The cell as plain data, as records and job descriptions carry it."""
        return {
            "repro": self.repro,
            "variant": self.variant,
            "label": self.label,
            "packages": dict(self.packages),
            "params": dict(self.params),
            "expect": self.expect.value,
            "also_ok": [v.value for v in self.also_ok],
        }

    def run_args(self, platform: str = "cpu") -> list[str]:
        return run_args(self.variant, dict(self.packages), dict(self.params), platform)

    def call_spec(self) -> dict[str, str]:
        return {
            "repro": self.repro,
            "variant": self.variant,
            **dict(self.packages),
            **dict(self.params),
        }


def run_args(
    variant: str, packages: Mapping[str, str], params: Mapping[str, str], platform: str = "cpu"
) -> list[str]:
    """The `reprobox run <repro>` arguments that select exactly this cell."""
    args = ["--variant", variant]
    args += [f"--with={k}=={v}" for k, v in packages.items()]
    args += [f"--param={k}={v}" for k, v in params.items()]
    if platform != "cpu":
        args += ["--platform", platform]
    return args


def session_params(variant: str, packages: Mapping[str, str], params: Mapping[str, str]) -> str:
    """How nox names the cell's parametrized session: `variant='broken', trl='0.7.1'`."""
    point = [("variant", variant), *packages.items(), *params.items()]
    return ", ".join(f"{k}={v!r}" for k, v in point)


def expectation(
    repro: Repro, variant: str, packages: Mapping[str, str], params: Mapping[str, str]
) -> tuple[Expectation, tuple[Verdict, ...]]:
    """The verdict expected for `variant` at this matrix point: the first matching rule of
    [matrix] expect, else the variant's own expectation."""
    spec = repro.variant(variant)
    matrix = repro.spec.matrix
    canonical = {canonicalize_name(k): v for k, v in packages.items()}
    for rule in matrix.expect if matrix else []:
        if rule.variant not in (None, variant):
            continue
        if all(_matches(key, cond, canonical, params) for key, cond in rule.when.items()):
            return rule.expect, tuple(spec.also_ok)
    return spec.expect, tuple(spec.also_ok)


def _matches(key: str, condition: str, packages: Mapping[str, str], params: Mapping[str, str]):
    if canonicalize_name(key) in packages:
        return Version(packages[canonicalize_name(key)]) in SpecifierSet(condition)
    if key in params:
        return params[key] == condition
    return False


def make_cell(
    repro: Repro,
    variant: str,
    packages: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
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
    )


def default_cells(repro: Repro, variants: Iterable[str] | None = None) -> list[Cell]:
    """The differential proof: each (default) variant at the repro's own pins."""
    names = list(variants) if variants is not None else repro.default_variants
    return [make_cell(repro, name) for name in names]


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
