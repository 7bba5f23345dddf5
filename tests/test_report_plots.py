"""The plots as a maintainer reads them: kl's step plot with no point under its legend and
its equal kl / local_kl panels drawn once; report.html carries every plot in the one file,
and the comment names them only where its reader can open them (a CI run's artifacts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from test_report import fake_repro, save_record

from reprobox.core.records import Record
from reprobox.report import build as report
from reprobox.report import plots

# kl's series as a 2-rank CPU run of its 4 default variants recorded them. With all four,
# main's legend (inside, loc="best") sat on broken's rank 0 at step 0 in both panels.
KL_BROKEN = [-0.028625, 0.005974, 0.034986], [0.001768, 0.027191, -0.019112]
KL_FIXED = [0.0, 0.000823, -0.022658], [0.0, -0.005578, -0.028582]
KL_WORKAROUND = [0.0, -0.002853, -0.013756], [0.0, 0.006399, 0.020159]
KL_CONTROL = [0.0, 0.001737, -0.006414], [0.0, 0.036025, 0.022584]


def _kl_series(ranks: tuple[list[float], list[float]], local_differs: bool = False) -> dict:
    series = {}
    for rank, values in enumerate(ranks):
        series[f"kl_rank{rank}"] = values
        series[f"local_kl_rank{rank}"] = [v + 0.001 for v in values] if local_differs else values
    return series


def _records(root: Path, local_differs: bool = False, every: bool = False) -> list[Record]:
    """broken and fixed (`every`: the workaround and the fp32 control too)."""
    fake_repro(root)
    runs = [("broken", "reproduced", KL_BROKEN), ("fixed", "clean", KL_FIXED)]
    if every:
        runs += [("workaround", "clean", KL_WORKAROUND), ("control_fp32", "clean", KL_CONTROL)]
    return [
        save_record(root, variant, verdict, series=_kl_series(ranks, local_differs))
        for variant, verdict, ranks in runs
    ]


def _points_under_legend(fig: Figure) -> list[tuple[str, int]]:
    """(line label, step) of every plotted point that the drawn legend box covers."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    hidden = []
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        box = legend.get_window_extent(renderer)
        for line in ax.get_lines():
            if str(line.get_label()).startswith("_"):
                continue  # the zero line
            xy = ax.transData.transform(line.get_xydata())
            hidden += [(str(line.get_label()), i) for i, p in enumerate(xy) if box.contains(*p)]
    return hidden


@pytest.mark.parametrize(("local_differs", "every"), [(False, True), (True, True), (False, False)])
def test_no_point_of_kl_is_under_the_legend(
    scratch_root: Path, local_differs: bool, every: bool
) -> None:
    records = _records(scratch_root, local_differs, every)
    per_record = [(r, plots.series_families(r.result["series"])) for r in records]
    panels = plots.same_families(per_record, ["kl", "local_kl"])
    fig = plots.series_figure(per_record, panels, "default")
    assert _points_under_legend(fig) == []


def test_a_legend_in_the_corner_of_the_bug_would_have_hidden_it(scratch_root: Path) -> None:
    """The check above can fail: a legend placed inside, over step 0 at the bottom left
    (where broken's rank 0 goes negative), is caught covering that point."""
    per_record = [(r, plots.series_families(r.result["series"])) for r in _records(scratch_root)]
    fig = plots.series_figure(per_record, [["kl"]], "default")
    fig.axes[0].legend(loc="lower left")
    assert ("broken rank0 (reproduced)", 0) in _points_under_legend(fig)


def test_equal_kl_and_local_kl_are_drawn_once_and_the_caption_says_so(
    scratch_root: Path, tmp_path: Path
) -> None:
    made = plots.series_plots(_records(scratch_root), tmp_path, ["broken", "fixed"])
    ((caption, path),) = made
    assert caption == "kl per step (local_kl equals kl in every run, drawn once) - default"
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_differing_kl_and_local_kl_keep_their_own_panels(
    scratch_root: Path, tmp_path: Path
) -> None:
    records = _records(scratch_root, local_differs=True)
    per_record = [(r, plots.series_families(r.result["series"])) for r in records]
    assert plots.same_families(per_record, ["kl", "local_kl"]) == [["kl"], ["local_kl"]]
    ((caption, _),) = plots.series_plots(records, tmp_path, ["broken", "fixed"])
    assert caption == "kl, local_kl per step - default"


def test_equal_in_one_record_only_is_not_equal(scratch_root: Path) -> None:
    broken, fixed = _records(scratch_root)
    fixed.result["series"]["local_kl_rank1"] = [0.0, 0.0, 0.0]
    per_record = [(r, plots.series_families(r.result["series"])) for r in (broken, fixed)]
    assert plots.same_families(per_record, ["kl", "local_kl"]) == [["kl"], ["local_kl"]]


def test_report_html_embeds_the_plots_and_the_comment_names_none(scratch_root: Path) -> None:
    _records(scratch_root)
    made = report.write_report(scratch_root, "ppo", report.ReportOptions(collect_env=False))
    page = made.html.read_text()
    assert made.plots and page.count('src="data:image/png;base64,') == len(made.plots)
    assert not re.search(r'src="(?!data:)', page)  # the one file is enough
    assert "kl per step (local_kl equals kl in every run, drawn once)" in page
    comment = made.comment.read_text()
    assert "plot" not in comment.lower() and "report folder" not in comment


def test_under_ci_the_comment_names_the_artifacts(scratch_root: Path) -> None:
    _records(scratch_root)
    url = "https://github.com/o/r/actions/runs/42"
    options = report.ReportOptions(collect_env=False, ci_run_url=url)
    comment = report.write_report(scratch_root, "ppo", options).comment.read_text()
    assert f"plots embedded, is in the artifacts of {url}.*" in comment
    assert "![" not in comment


def test_the_step_the_verdict_reads_is_singled_out(scratch_root: Path) -> None:
    """kl's verdict reads step 0 (`max_abs_kl_step0`); steps 1-2, where the clean variants
    reach |KL| 0.025, must not weigh as much: step 0 is shaded and named in the legend. A
    rule named for no step shades nothing."""
    records = _records(scratch_root)
    for record in records:
        record.decided_by = ["max_abs_kl_step0"]
    assert plots.verdict_step(records) == 0
    per_record = [(r, plots.series_families(r.result["series"])) for r in records]
    fig = plots.series_figure(per_record, [["kl"]], "default", step=plots.verdict_step(records))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "step 0: the step the verdict reads" in labels
    (band,) = ax.patches
    assert band.get_x() < 0 < band.get_x() + band.get_width() < 1
    for record in records:
        record.decided_by = ["max_abs_logp_diff"]
    assert plots.verdict_step(records) is None
