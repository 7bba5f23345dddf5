"""The nox sessions' view of the repros: which parametrized cells exist, and their command.

noxfile.py stays thin: it asks this module for the cells of each repro and turns each into
a parametrized session (`repro_lm_head(default)`, `repro_kl(variant='broken', trl='0.7.1')`).
Every cell's call_spec carries repro, variant and versions, so CI can build its job matrix
from `nox --json -l`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reprobox.core import spec
from reprobox.core.cells import DEFAULT_CELL, VersionsInRange, matrix_cells
from reprobox.core.errors import ReproboxError
from reprobox.core.settings import Settings
from reprobox.envs.index import IndexAxes, SimpleIndex

DEFAULT_TAG = "default"
MATRIX_TAG = "matrix"
CORPUS_TAG = "corpus"  # a corpus repro's default cell: not in `nox -t default` (make repro)
DEFAULT_CELL_ID = "default"


@dataclass(frozen=True)
class SessionCell:
    id: str
    call_spec: dict[str, str | None]
    tags: list[str]
    args: list[str] = field(default_factory=list)  # for `reprobox run <repro>`


def index_axes(environ: Mapping[str, str]) -> IndexAxes:
    """Range axes resolved against the index the settings in `environ` name (nox is an entry
    point of its own: the noxfile passes its environment, once)."""
    return IndexAxes(SimpleIndex.from_settings(Settings.from_env(environ)))


def session_cells(
    root: Path, name: str, ranges: VersionsInRange | None = None
) -> tuple[list[str], list[SessionCell], str]:
    """(parameter names, cells, warning) for `repro_<name>`; the default cell comes first.

    A matrix whose version range cannot be resolved (no index reachable) leaves only the
    default cell, with a warning, rather than breaking `nox -l` for every repro; releases a
    range left out (yanked, pre-releases) are named in the warning too."""
    repro = spec.load(root, name)
    warning = ""
    try:
        cells = matrix_cells(repro, ranges)
    except ReproboxError as exc:
        cells, warning = [], f"matrix of {name} left out: {exc}"
    if isinstance(ranges, IndexAxes) and ranges.notes():
        warning = "; ".join(filter(None, [warning, *ranges.notes()]))
    axes = _axes(repro)
    names = ["repro", "variant", *axes]
    default = SessionCell(
        id=DEFAULT_CELL_ID,
        call_spec={"repro": name, "variant": DEFAULT_CELL, **dict.fromkeys(axes)},
        tags=[CORPUS_TAG if repro.corpus else DEFAULT_TAG],
    )
    found = [default]
    for cell in cells:
        point = {**dict(cell.packages), **dict(cell.params)}
        found.append(
            SessionCell(
                id=cell.session_params,
                call_spec={
                    "repro": name,
                    "variant": cell.variant,
                    **{a: point.get(a) for a in axes},
                },
                tags=[MATRIX_TAG],
                args=cell.run_args(),
            )
        )
    return names, found, warning


def _axes(repro: spec.Repro) -> list[str]:
    m = repro.spec.matrix
    return [*m.packages, *m.params] if m else []
