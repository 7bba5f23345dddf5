"""The report's pictures: a headline metric per cell, and each result's series per step.

The series plot is the picture a reporter otherwise takes from W&B (e.g. KL per PPO step,
broken vs fixed, one line per rank). matplotlib with the Agg backend: no display needed, and
the same bytes on a laptop and a CI runner.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from packaging.version import InvalidVersion, Version

from reprobox.bisect.summary import BisectSummary, SweepDetails
from reprobox.core.records import Record
from reprobox.report.metric_text import is_excess

_RANK = re.compile(r"^(?P<family>.+?)[_-]?(?P<kind>rank|seed)(?P<n>\d+)$")
_FACTOR = re.compile(r"_over_|factor|ratio", re.IGNORECASE)
_VERDICT_COLOUR = {"reproduced": "#cf222e", "clean": "#1a7f37", "cannot_test": "#8c959f"}
_LINESTYLES = ["-", "--", ":", "-."]
_VERDICT_HATCH = {"reproduced": "//", "clean": "", "cannot_test": "..", None: "xx"}
MAX_SERIES_FIGURES = 12
Families = dict[str, dict[str, list[float]]]  # family -> line (rank0, seed1, "") -> values


def legend_outside(ax: Axes, **kwargs: Any) -> None:
    """The legend right of the axes, never over them: a legend inside may sit on the one
    point that shows the bug (kl's step 0), and "best" only minimises the overlap."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def point_label(record: Record, platforms: int = 1) -> str:
    """Where in the matrix a record sits: `default`, or `transformers=5.24.0, model=t5`."""
    axes = [*record.packages.items(), *record.params.items()]
    label = ", ".join(f"{k}={v}" for k, v in axes) or "default"
    return f"{label} [{record.platform}]" if platforms > 1 else label


def _finite(values: Sequence[object]) -> list[float]:
    return [float(v) if isinstance(v, int | float) else math.nan for v in values]


def metric_bars(
    records: Sequence[Record],
    metric: str,
    path: Path,
    variants: Sequence[str],
    text: Callable[[str], str] = str,
) -> Path | None:
    """Grouped bars: one group per matrix point, one bar per variant; hatched = reproduced."""
    have = [r for r in records if isinstance(r.metrics.get(metric), int | float)]
    if not have:
        return None
    platforms = len({r.platform for r in records})
    points = list(dict.fromkeys(point_label(r, platforms) for r in have))
    shown = [v for v in variants if any(r.variant == v for r in have)]
    shown += sorted({r.variant for r in have} - set(shown))
    width = min(0.8 / max(len(shown), 1), 0.3)
    wide = 0.9 * len(points) * max(len(shown), 1) ** 0.5
    fig, ax = plt.subplots(figsize=(min(max(6.0, wide), 14.0) + 1.8, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, variant in enumerate(shown):
        xs, ys, hatches = [], [], []
        for j, point in enumerate(points):
            match = [r for r in have if r.variant == variant and point_label(r, platforms) == point]
            if match:
                xs.append(j + (i - (len(shown) - 1) / 2) * width)
                ys.append(float(match[0].metrics[metric]))
                hatches.append(_VERDICT_HATCH.get(match[0].verdict, ""))
        bars = ax.bar(xs, ys, width, label=text(variant), color=colours[i % len(colours)])
        for bar, hatch, y in zip(bars, hatches, ys, strict=True):
            bar.set_hatch(hatch)
            ax.annotate(
                f"{y:.3g}",
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    values = [float(r.metrics[metric]) for r in have]
    if min(values) > 0 and max(values) / min(values) > 50:
        ax.set_yscale("log")
    if is_factor(metric):  # a ratio to the right answer: 1x is correct
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1.0, label="1x (correct)")
    ax.set_xticks(range(len(points)), [text(p) for p in points], rotation=30, ha="right")
    ax.set_xlim(-0.7, len(points) - 0.3)  # one point: bars of a sensible width, not the frame
    ax.set_ylabel(text(metric))
    ax.set_title(f"{text(metric)} per cell (hatched: reproduced)")
    legend_outside(ax, title="variant", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def is_factor(metric: str) -> bool:
    """A metric that is a ratio to the correct value (`lm_head_over_mean`): 1x is right
    (an excess over a tolerance is no ratio: 0 is right there)."""
    return bool(_FACTOR.search(metric)) and not is_excess(metric)


def series_families(series: dict[str, object]) -> dict[str, dict[str, list[float]]]:
    """`{"kl_rank0": [...], "kl_rank1": [...]}` -> `{"kl": {"rank0": [...], "rank1": [...]}}`
    (and `order_seed0` -> `{"order": {"seed0": ...}}`); a series without a rank or seed
    suffix is its own family."""
    families: dict[str, dict[str, list[float]]] = {}
    for name, values in series.items():
        if not isinstance(values, list) or not values:
            continue
        match = _RANK.match(name)
        family, line = (match["family"], f"{match['kind']}{match['n']}") if match else (name, "")
        families.setdefault(family, {})[line] = _finite(values)
    return families


def _by_seed(fams: dict[str, dict[str, list[float]]]) -> bool:
    return bool(fams) and all(
        lines and all(k.startswith("seed") for k in lines) for lines in fams.values()
    )


def series_plots(
    records: Sequence[Record],
    out_dir: Path,
    variants: Sequence[str],
    text: Callable[[str], str] = str,
) -> list[tuple[str, Path]]:
    """One figure per matrix point holding series (`series_figure`; seeds: `_seed_panels`).
    Returns (caption, path) pairs."""
    platforms = len({r.platform for r in records})
    by_point: dict[str, list[Record]] = {}
    for record in records:
        if isinstance(record.result.get("series"), dict) and record.result["series"]:
            by_point.setdefault(point_label(record, platforms), []).append(record)
    order = {v: i for i, v in enumerate(variants)}
    made = []
    for number, (point, members) in enumerate(by_point.items()):
        if number >= MAX_SERIES_FIGURES:
            break
        members.sort(key=lambda r: order.get(r.variant, len(order)))
        per_record = [(r, series_families(r.result["series"])) for r in members]
        families = list(dict.fromkeys(f for _, fams in per_record for f in fams))
        if not families:
            continue
        if all(_by_seed(fams) for _, fams in per_record):
            path = _seed_panels(per_record, families, point, number, out_dir, text)
            made.append(
                (text(f"{', '.join(families)} per seed, one panel per variant - {point}"), path)
            )
            continue
        panels = same_families(per_record, families)
        fig = series_figure(per_record, panels, point, text, verdict_step(members))
        slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", point)[:80]
        path = _save(fig, out_dir / f"series_{number:02d}_{slug}.png")
        made.append((text(series_caption(panels, point)), path))
    return made


def same_families(
    per_record: Sequence[tuple[Record, Families]], families: Sequence[str]
) -> list[list[str]]:
    """The families grouped into panels: two families whose series are equal in every
    record (kl's `kl` and `local_kl`, trl's logged KL and its own formula, on a run where
    they agree) share one panel instead of drawing the same picture twice."""
    panels: list[list[str]] = []
    for family in families:
        for panel in panels:
            if all(_equal(fams.get(panel[0]), fams.get(family)) for _, fams in per_record):
                panel.append(family)
                break
        else:
            panels.append([family])
    return panels


def _equal(a: dict[str, list[float]] | None, b: dict[str, list[float]] | None) -> bool:
    if not a or not b or a.keys() != b.keys():
        return False
    return all(
        len(a[k]) == len(b[k])
        and all(
            x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a[k], b[k], strict=True)
        )
        for k in a
    )


def series_caption(panels: Sequence[Sequence[str]], point: str) -> str:
    """`kl per step (local_kl equals kl in every run, drawn once) - default`."""
    names = ", ".join(panel[0] for panel in panels)
    same = [f"{' and '.join(p[1:])} equals {p[0]} in every run" for p in panels if len(p) > 1]
    shared = f" ({'; '.join(same)}, drawn once)" if same else ""
    return f"{names} per step{shared} - {point}"


_STEP = re.compile(r"_step(\d+)$")  # a rule metric read at one step: `max_abs_kl_step0`


def verdict_step(records: Sequence[Record]) -> int | None:
    """The step the verdict reads, when the metrics that decided are named for one step
    (`..._step0`, repros/README.md's metric names): the plot singles it out."""
    steps = {int(m[1]) for r in records for name in r.decided_by if (m := _STEP.search(name))}
    return steps.pop() if len(steps) == 1 else None


def series_figure(
    per_record: Sequence[tuple[Record, Families]],
    panels: Sequence[Sequence[str]],
    point: str,
    text: Callable[[str], str] = str,
    step: int | None = None,
) -> Figure:
    """A panel per family (or group of equal families), a colour per variant, a line style
    per rank, the legend outside the axes; the step the verdict reads (`verdict_step`)
    shaded and named, so the later steps do not weigh as much as it."""
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9.5, 3.2 * len(panels)), squeeze=False, sharex=True
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        family = panel[0]
        for i, (record, fams) in enumerate(per_record):
            for k, (line, values) in enumerate(sorted(fams.get(family, {}).items())):
                name = f"{record.variant} {line}".strip()
                ax.plot(
                    range(len(values)),
                    values,
                    marker="o",
                    markersize=3,
                    linestyle=_LINESTYLES[k % len(_LINESTYLES)],
                    color=colours[i % len(colours)],
                    label=text(f"{name} ({record.verdict or 'error'})"),
                )
        ax.axhline(0.0, color="grey", linewidth=0.6)
        if step is not None:
            ax.axvspan(step - 0.25, step + 0.25, color="gold", alpha=0.3, zorder=0,
                       label=f"step {step}: the step the verdict reads")  # fmt: skip
        shown = " = ".join(panel)
        ax.set_ylabel(text(shown))
        ax.set_title(text(f"{shown} per step - {point}"))
        ax.grid(alpha=0.3)
        legend_outside(ax, fontsize=7)
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _seed_panels(
    per_record: list[tuple[Record, Families]],
    families: list[str],
    point: str,
    number: int,
    out_dir: Path,
    text: Callable[[str], str],
) -> Path:
    """One panel per variant, its seeds overlaid: where the seeds give the same sequence
    (the bug), the lines lie on top of each other."""
    fig, axes = plt.subplots(
        len(per_record), 1, figsize=(9.0, 2.6 * len(per_record)), squeeze=False, sharex=True
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (record, fams) in zip(axes[:, 0], per_record, strict=True):
        for family in families:
            lines = sorted(fams.get(family, {}).items())
            for k, (seed, values) in enumerate(lines):
                ax.plot(
                    range(len(values)),
                    values,
                    marker="o",
                    markersize=4 + 2 * (len(lines) - k - 1),  # larger under smaller: all seen
                    linestyle=_LINESTYLES[k % len(_LINESTYLES)],
                    color=colours[k % len(colours)],
                    alpha=0.8,
                    label=text(f"{family} {seed}"),
                )
        ax.set_title(text(f"{record.variant} ({record.verdict or 'error'}) - {point}"))
        ax.grid(alpha=0.3)
        legend_outside(ax, fontsize=7)
    axes[-1, 0].set_xlabel("position")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", point)[:80]
    return _save(fig, out_dir / f"series_{number:02d}_{slug}.png")


def release_plots(
    records: Sequence[Record],
    summaries: Sequence[BisectSummary],
    out_dir: Path,
    variants: Sequence[str],
    text: Callable[[str], str] = str,
) -> list[tuple[str, Path]]:
    """The verdict over releases, one row per variant: from a sweep's probes and from the
    matrix cells that vary one package. Returns (caption, path) pairs."""
    by_package: dict[str, dict[str, dict[str, str]]] = {}  # package -> variant -> v -> verdict
    for summary in summaries:
        swept = summary.details
        if not isinstance(swept, SweepDetails) or not swept.package:
            continue
        row = by_package.setdefault(swept.package, {}).setdefault(
            f"{summary.variant or 'sweep'} (sweep)", {}
        )
        for probe in summary.probes:
            row.setdefault(probe.item, probe.verdict or "skip")
    for record in records:
        if len(record.packages) != 1 or record.params:
            continue
        ((package, version),) = record.packages.items()
        row = by_package.setdefault(package, {}).setdefault(record.variant, {})
        row[version] = record.verdict or "error"
    made = []
    for package, rows in by_package.items():
        releases = sorted({v for row in rows.values() for v in row}, key=_release_key)
        if len(releases) < 2:
            continue
        order = {v: i for i, v in enumerate(variants)}
        names = sorted(rows, key=lambda n: (order.get(n.split(" ")[0], len(order)), n))
        fig, ax = plt.subplots(
            figsize=(min(max(6.0, 0.45 * len(releases) + 2), 16.0), 1.0 + 0.6 * len(names))
        )
        for y, name in enumerate(names):
            for x, release in enumerate(releases):
                verdict = rows[name].get(release)
                if verdict is None:
                    continue
                ax.scatter(
                    [x], [y], s=140, marker="s",
                    color=_VERDICT_COLOUR.get(verdict, "#ffffff"),
                    edgecolors="black", linewidths=0.6,
                )  # fmt: skip
        ax.set_xticks(range(len(releases)), [text(r) for r in releases], rotation=45, ha="right")
        ax.set_yticks(range(len(names)), [text(n) for n in names])
        ax.set_xlim(-0.6, len(releases) - 0.4)
        ax.set_ylim(-0.6, len(names) - 0.4)
        ax.set_xlabel(text(package))
        handles = [
            Line2D([], [], marker="s", linestyle="", color=c, markeredgecolor="black",
                       label=v.replace("_", " "))
            for v, c in _VERDICT_COLOUR.items()
        ]  # fmt: skip
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.set_title(text(f"verdict over {package} releases"))
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", package)[:60]
        made.append(
            (text(f"verdict over {package} releases"), _save(fig, out_dir / f"releases_{slug}.png"))
        )
    return made


def _release_key(version: str) -> tuple[int, object]:
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No timestamps in the PNG metadata: the same results give the same bytes.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
