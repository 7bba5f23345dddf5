"""A metric's value as a reader takes it in: counts with their totals, tolerances as
"within tolerance", and a metric an older record lacks said to be missing.

Two naming conventions, from repros/README.md ("Metric names"), and no metric known by
name: a metric `X` with a sibling `X_of` is a count out of a total (`same_order_pairs = 3`,
`same_order_pairs_of = 3` reads `3 of 3`), and `X_of` is never a column of its own; a metric
ending in `excess_over_tolerance` is >= 0, how far past the tolerance the run went, and 0
reads `within tolerance` (not a negative margin that looks like a violation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from reprobox.report import markdown as md

TOTAL_SUFFIX = "_of"
EXCESS_SUFFIX = "excess_over_tolerance"


def is_total(name: str, names: Sequence[str]) -> bool:
    """`X_of` beside `X`: the total of a count, shown with it."""
    return name.endswith(TOTAL_SUFFIX) and name[: -len(TOTAL_SUFFIX)] in names


def is_excess(name: str) -> bool:
    """How far past a tolerance (>= 0): 0 means within it."""
    return name.endswith(EXCESS_SUFFIX)


def shown(metrics: Mapping[str, object], name: str) -> str:
    """`metrics[name]` for a table cell (markdown): `3 of 3`, `within tolerance`, `6.493`;
    `not recorded` when a record that has metrics lacks this one (a record from before the
    metric was named so); empty when the record has no metrics at all (it did not run)."""
    value = metrics.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "not recorded" if metrics else ""
    total = metrics.get(name + TOTAL_SUFFIX)
    if isinstance(total, int | float) and not isinstance(total, bool) and _whole(value, total):
        return f"{int(value)} of {int(total)}"
    if is_excess(name) and value == 0:
        return "within tolerance"
    return md.number(value)


def _whole(*values: float) -> bool:
    return all(math.isfinite(v) and float(v).is_integer() for v in values)
