"""What `reprobox list` shows, as plain data: one row per repro, or one repro in full.

The data is what `--json` prints and what `ui` draws, so both always say the same. A matrix
axis given as a version range needs the package index; when it cannot be read the cells are
not guessed: the answer says so in one line (`matrix_note`) and lists the default cells.
"""

from __future__ import annotations

from typing import Any

from reprobox.core import repeat_verdict
from reprobox.core.cells import Cell, VersionsInRange, default_cells, matrix_cells
from reprobox.core.errors import ReproboxError
from reprobox.core.spec import Repro, Rule


def row(repro: Repro) -> dict[str, Any]:
    """One repro as `reprobox list` shows it among the others."""
    return {
        "repro": repro.name,
        "title": repro.spec.repro.title,
        "upstream": repro.spec.repro.upstream,
        "variants": {
            name: {
                "expect": variant.expect.value,
                "default": variant.default,
                "description": variant.description,
            }
            for name, variant in repro.spec.variants.items()
        },
        "default_cells": [cell.label for cell in default_cells(repro)],
    }


def detail(repro: Repro, versions_in_range: VersionsInRange | None) -> dict[str, Any]:
    """One repro in full: variants, verdict rule, launch, bisect defaults and every cell."""
    spec = repro.spec
    launch = spec.launch
    found = row(repro)
    found.pop("default_cells")
    found.update(
        {
            "script": spec.repro.script,
            "fix_links": list(spec.repro.fix_links),
            "platforms": list(dict.fromkeys(["cpu", *spec.platforms])),
            "launch": {
                "launcher": launch.launcher,
                "processes": launch.processes,
                "timeout": launch.timeout,
                "batch": launch.batch,
                "preflight": launch.preflight,
            },
            "verdict": _rules(spec.verdict.reproduced_if),
            "test": repeat_verdict.declared(spec.verdict),
            "variants": {name: _variant(repro, name) for name in spec.variants},
            "bisect": spec.bisect.model_dump() if spec.bisect else None,
        }
    )
    cells, note = _cells(repro, versions_in_range)
    found["cells"] = cells
    found["matrix_note"] = note
    return found


def _rules(rules: list[Rule]) -> list[dict[str, Any]]:
    return [{"metric": rule.metric, "above": rule.above} for rule in rules]


def _variant(repro: Repro, name: str) -> dict[str, Any]:
    variant = repro.spec.variants[name]
    override = variant.launch.model_dump(exclude_none=True) if variant.launch else {}
    return {
        "expect": variant.expect.value,
        "also_ok": [verdict.value for verdict in variant.also_ok],
        "default": variant.default,
        "description": variant.description,
        "fix": variant.fix,
        "pins": list(variant.pins),
        "platforms": variant.platforms,
        "verdict": _rules(variant.verdict.reproduced_if) if variant.verdict else None,
        # the declared test this variant is judged by (its own [verdict], else the repro's)
        "test": repeat_verdict.declared(repro.verdict(name)),
        "test_text": repeat_verdict.describe(repro.verdict(name)),
        "launch": override or None,
    }


def _cells(
    repro: Repro, versions_in_range: VersionsInRange | None
) -> tuple[list[dict[str, Any]], str | None]:
    """The default cells and the matrix's, with the note that explains missing ones."""
    found = [_cell(cell, "default") for cell in default_cells(repro)]
    if repro.spec.matrix is None:
        return found, None
    try:
        cells = matrix_cells(repro, versions_in_range)
    except ReproboxError as exc:
        ranges = [
            f"{package} {values}"
            for package, values in repro.spec.matrix.packages.items()
            if isinstance(values, str)
        ]
        needs = f" ({', '.join(ranges)}: a range, read from the package index)" if ranges else ""
        return found, f"matrix cells not listed{needs}: {exc}"
    return found + [_cell(cell, "matrix") for cell in cells], None


def _cell(cell: Cell, kind: str) -> dict[str, Any]:
    return {
        "label": cell.label,
        "kind": kind,
        "expect": cell.expect.value,
        "also_ok": [verdict.value for verdict in cell.also_ok],
        "run_args": cell.run_args(),
    }
