"""The report: built from fake records on disk (no repro runs), for a repro the harness only
knows from its repro.toml; bad input gives one clear error and never costs data on disk."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reprobox.cli import report as report_cli
from reprobox.core.errors import BadInput
from reprobox.core.judge import Status
from reprobox.core.records import Record, RecordStore
from reprobox.report import build as report
from reprobox.report import export, plots

FAKE_TOML = """\
[repro]
title = "Fake PPO: nonzero KL at step 0"
upstream = "https://example.invalid/issues/1"
script = "ppo.py"

[launch]
launcher = "accelerate"
processes = 2
timeout = 60
config = "zero.yaml"
env = { OMP_NUM_THREADS = "1" }

[env]
pins = ["torch==2.13.0", "trl==0.7.1"]

[verdict]
reproduced_if = [{ metric = "max_abs_kl_step0", above = 0.0 }]

[variants.broken]
expect = "reproduced"
description = "the old release"

[variants.fixed]
expect = "clean"
description = "the release with the fix"
pins = ["trl==0.7.2"]

[matrix]
variants = ["broken", "fixed"]
packages = { trl = ["0.7.1", "0.7.2"] }
expect = [{ when = { trl = ">=0.7.2" }, variant = "broken", expect = "clean" }]

[bisect]
package = "trl"
variant = "broken"
good = "0.7.2"
bad = "0.7.1"

[platforms.gpu]
pins = ["torch==2.13.0"]
"""


def results_dir(root: Path) -> Path:
    """The results folder of a scratch checkout (conftest points REPROBOX_RESULTS there)."""
    return root / "results"


def fake_repro(root: Path, name: str = "ppo") -> Path:
    """A repro directory with a series-writing script, as `kl` will be."""
    directory = root / "repros" / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "repro.toml").write_text(FAKE_TOML)
    (directory / "ppo.py").write_text('"""The fake PPO step."""\nprint("kl")\n')
    (directory / "zero.yaml").write_text("distributed_type: DEEPSPEED\n")
    return directory


def save_record(
    root: Path,
    variant: str,
    verdict: str | None,
    *,
    repro: str = "ppo",
    expect: str | None = None,
    packages: dict[str, str] | None = None,
    kl: float = 0.0,
    series: dict[str, list[float]] | None = None,
    command: list[str] | None = None,
    started: str = "2026-11-30T00:00:00Z",
    reason: str = "",
    folder: str | None = None,
) -> Record:
    """A record as the harness writes it, in a fresh run directory."""
    packages = packages or {}
    label = variant + (f"[{','.join(f'{k}={v}' for k, v in packages.items())}]" if packages else "")
    slug = folder or label.replace("[", "@").rstrip("]")
    run_dir = RecordStore(results_dir(root)).new_run_dir(repro, slug)
    expect = expect or {"broken": "reproduced"}.get(variant, "clean")
    status = "error" if verdict is None else ("match" if verdict == expect else "mismatch")
    metrics = {"max_abs_kl_step0": kl, "max_abs_logp_diff": kl / 2, "steps": 3.0}
    result = {
        "schema": 1,
        "variant": variant,
        "verdict": verdict,
        "metrics": metrics,
        "series": series or {},
        "versions": {"torch": "2.13.0+cpu", "trl": packages.get("trl", "0.7.1")},
        "device": "cpu",
        "backend": "gloo",
        "world_size": 2,
        "seed": 0,
        "python": "3.11.7",
    }
    record = Record(
        repro=repro,
        variant=variant,
        label=label,
        packages=packages,
        params={},
        expect=expect,
        also_ok=[],
        status=status,
        verdict=verdict,
        reason=reason,
        exit_code=4 if verdict is None else 0,
        metrics=metrics if verdict else {},
        result=result if verdict else {},
        command=command
        or [
            str(root / "envs" / "abc" / "bin" / "accelerate"),
            "launch",
            "--config_file",
            str(root / "repros" / repro / "zero.yaml"),
            "--num_processes",
            "2",
            str(root / "repros" / repro / "ppo.py"),
            "--variant",
            variant,
        ],
        wall_s=3.5,
        started_at=started,
        dir=str(run_dir),
    )
    record.save()
    (run_dir / "launch.log").write_text("$ accelerate launch ppo.py\nstep 0 kl=0.1\n")
    return record


KL_BROKEN = {"kl_rank0": [0.12, 0.3, 0.5], "kl_rank1": [-0.1, 0.2, 0.45]}
KL_FIXED = {"kl_rank0": [0.0, 0.01, 0.05], "kl_rank1": [0.0, 0.02, 0.04]}


@pytest.fixture
def ppo_root(scratch_root: Path) -> Path:
    """A checkout with the fake repro and its default and matrix records on disk."""
    fake_repro(scratch_root)
    save_record(scratch_root, "broken", "reproduced", kl=0.12, series=KL_BROKEN)
    save_record(scratch_root, "fixed", "clean", kl=0.0, series=KL_FIXED)
    for trl in ("0.7.1", "0.7.2"):
        broken_kl = 0.12 if trl == "0.7.1" else 0.0
        broken_verdict = "reproduced" if trl == "0.7.1" else "clean"
        save_record(
            scratch_root,
            "broken",
            broken_verdict,
            packages={"trl": trl},
            expect=broken_verdict,
            kl=broken_kl,
        )
        save_record(scratch_root, "fixed", "clean", packages={"trl": trl}, kl=0.0)
    return scratch_root


def _bisect_summary(root: Path, **extra: object) -> None:
    folder = results_dir(root) / "ppo" / "_bisect" / "20261130T000000-abc"
    folder.mkdir(parents=True)
    summary = {
        "result": "trl 0.7.2 is the first release where broken is clean.",
        "status": "found",
        "package": "trl",
        "variant": "broken",
        "good": "0.7.2",
        "bad": "0.4.7",
        "first": "0.7.2",
        "last_start": "0.7.1",
        "start_verdict": "reproduced",
        "end_verdict": "clean",
        "versions": ["0.4.7", "0.7.1", "0.7.2"],
        "candidates": ["0.7.2"],
        "probes": [
            {"item": "0.4.7", "verdict": "reproduced", "wall_s": 20.0},
            {"item": "0.7.1", "verdict": "reproduced", "wall_s": 21.5},
            {"item": "0.7.2", "verdict": "clean", "wall_s": 19.0},
        ],
        **extra,
    }
    (folder / "summary.json").write_text(json.dumps(summary))


def _tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


NO_ENV = report.ReportOptions(collect_env=False)


def test_report_from_records_on_disk(ppo_root: Path) -> None:
    _bisect_summary(ppo_root)
    before = _tree_digest(results_dir(ppo_root) / "ppo")
    made = report.write_report(ppo_root, "ppo", NO_ENV)

    assert made.dir == results_dir(ppo_root) / "ppo" / "_report"
    comment = made.comment.read_text()
    # the headline first: the bisect's answer with a compare link, then the bug's result
    # with the versions it ran, then what is clean
    first, second = comment.split("\n\n")[:2]
    assert first == (
        "**Fixed in trl 0.7.2:** 0.7.1 is the last release that reproduces, 0.7.2 the first "
        "clean one ([compare 0.7.1...0.7.2](https://github.com/huggingface/trl/compare/"
        "v0.7.1...v0.7.2))."
    )
    assert second.startswith(
        "**Reproduced** with torch 2.13.0+cpu, trl 0.7.1, 2 ranks (gloo, cpu): `broken`"
    )
    assert second.endswith("`fixed` is clean, as expected.")
    assert "### Expected behavior" in comment
    # the minimal reproduction: a fresh venv per pin set, the launcher lines a person types
    cpu = "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert (
        "# broken\npython3 -m venv env1 && . env1/bin/activate\n"
        f"pip install {cpu} torch==2.13.0 trl==0.7.1\n"
        "OMP_NUM_THREADS=1 accelerate launch --config_file zero.yaml --num_processes 2 "
        "ppo.py --variant broken   # expect: reproduced\n"
    ) in comment
    assert (
        "deactivate\n\n# fixed\npython3 -m venv env2 && . env2/bin/activate\n"
        f"pip install {cpu} torch==2.13.0 trl==0.7.2\n"
    ) in comment
    assert "reprobox bundle" not in comment  # the maintainer has no reprobox
    assert "<details><summary><code>ppo.py</code> (2 lines)</summary>" in comment
    assert '"""The fake PPO step."""' in comment
    # one results table: variant, verdict, the rule's metric and one headline metric
    assert (
        "| variant | verdict | `max_abs_kl_step0` | `max_abs_logp_diff` |\n|---|---|---|---|\n"
        "| `broken` | ✅ reproduced | 0.12 | 0.06 |\n| `fixed` | ✅ clean | 0 | 0 |"
    ) in comment
    assert "| steps |" not in comment and "`steps`" not in comment  # a constant: no headline
    assert "- `broken`: the old release" in comment
    # the matrix collapsed, with the commands of its cells
    assert "<details><summary>Matrix: 4 cells</summary>" in comment
    assert "| trl=0.7.2 | ✅ clean | ✅ clean |" in comment
    assert "reprobox run ppo --variant broken --with=trl==0.7.1" in comment
    # versions that differ between cells, once
    assert "| trl | 0.7.2 |" in comment
    # each fact once: no second verdict list, no repeated launcher commands
    assert comment.count("the old release") == 1
    assert comment.count("--variant broken   # expect") == 1
    # plots: not in the comment (gh cannot attach them) and, with no CI run to link, not
    # mentioned (the maintainer has no report folder)
    assert "![" not in comment and "plots" not in comment and "report folder" not in comment
    assert comment.rstrip().endswith("<!-- reprobox-report: ppo -->")
    # report.md: a title, the same sections and the plots as relative links
    md = made.markdown.read_text()
    assert md.startswith("# Fake PPO: nonzero KL at step 0\n\nUpstream: ")
    names = sorted(p.name for p in made.plots)
    assert names[:2] == ["metric_max_abs_kl_step0.png", "metric_max_abs_logp_diff.png"]
    assert "releases_trl.png" in names  # the verdict over the matrix's trl releases
    assert any(n.startswith("series_00_default") for n in names)
    for path in made.plots:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({path.relative_to(made.dir).as_posix()})" in md
    # report.html: one file, every plot embedded
    page = made.html.read_text()
    assert page.count('src="data:image/png;base64,') == len(made.plots)
    assert 'src="plots/' not in page and "<table>" in page
    # results.json: the records merged
    merged = json.loads(made.results.read_text())
    assert merged["repro"] == "ppo" and len(merged["records"]) == 6
    assert merged["bisect"][0]["status"] == "found"
    # the records themselves are untouched
    after = _tree_digest(results_dir(ppo_root) / "ppo")
    assert {k: v for k, v in after.items() if not k.startswith("_report")} == before


def test_cells_that_never_ran_are_listed_apart(ppo_root: Path) -> None:
    """A bad --with or a failed install says nothing about the bug: not counted against it."""
    why = "cannot resolve: no such version: trl==99.0.0"
    stray = save_record(ppo_root, "broken", None, packages={"trl": "99.0.0"}, reason=why)
    stray.command, stray.exit_code = [], 2
    stray.save()
    asked = report.ReportOptions(collect_env=False, comment_not_run=True)
    comment = report.write_report(ppo_root, "ppo", asked).comment.read_text()
    assert comment.startswith("**Reproduced** with ")
    assert "Not as expected" not in comment
    assert "### Not run" in comment
    assert "- `broken[trl=99.0.0]`: cannot resolve: no such version: trl==99.0.0" in comment
    assert "### Problems" not in comment and "trl=99.0.0 |" not in comment


SIGNED_VARIANT = """
[variants.signed]
expect = "unknown"
default = false
description = "the signed step-0 KL over many sequences"
args = ["--criterion", "signed-kl"]
verdict = { reproduced_if = [{ metric = "signed_kl_negative_z", above = 3.0 }] }
"""

SIGNED_MEASUREMENT = {
    "name": "signed step-0 KL per sequence",
    "rows": [
        {"group": "rank 0", "n": 4096, "mean": 0.00017, "se": 0.000694,
         "fraction_negative": 0.505, "z": 0.245},
        {"group": "rank 1", "n": 4096, "mean": 0.000358, "se": 0.000706,
         "fraction_negative": 0.501, "z": 0.507},
        {"group": "all", "n": 8192, "mean": 0.000264, "se": 0.000495,
         "fraction_negative": 0.503, "z": 0.533},
    ],
    # text from the script: a mention, a reference, a comment opener, a table pipe
    "conclusion": "the sign is noise at this sample size (pooled z = +0.53) @team #506 <!-- |",
}  # fmt: skip


def _recorded(root: Path, measurement: object) -> Record:
    """A cell expected `unknown` that recorded a measurement (status recorded, not judged)."""
    record = save_record(root, "signed", "clean", expect="unknown", reason="noise, z = +0.53")
    record.status = Status.RECORDED
    record.metrics = {"signed_kl_negative_z": 0.0, "signed_kl_z": 0.533, "signed_kl_n": 8192.0}
    record.result = {**record.result, "metrics": record.metrics, "measurement": measurement}
    record.save()
    return record


def test_a_recorded_measurement_has_its_own_section(ppo_root: Path) -> None:
    """The signed-KL measurement of kl is shown as what it measured and what its script
    concludes, not as a verdict in the pass/fail table."""
    toml = ppo_root / "repros" / "ppo" / "repro.toml"
    toml.write_text(toml.read_text() + SIGNED_VARIANT)
    _recorded(ppo_root, SIGNED_MEASUREMENT)
    comment = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text()
    results = comment.split("### Results", 1)[1].split("### Measurements", 1)[0]
    assert "`signed`" not in results and "signed_kl" not in results  # no pass or fail
    assert "`broken` | ✅ reproduced" in results
    assert comment.startswith("**Reproduced** with ")  # the bug's cell still heads it
    assert "`signed` recorded a measurement (see *Measurements*)." in comment
    section = comment.split("### Measurements", 1)[1]
    assert section.startswith(
        "\n\nRecorded, not judged (expect `unknown`): the figures and the conclusion are "
        "the script's own.\n\n`signed`: the signed step-0 KL over many sequences\n\n"
        "Measured: signed step-0 KL per sequence.\n\n"
        "|  | n | mean ± SE | negative | z = mean / SE |\n|---|---|---|---|---|\n"
        "| rank 0 | 4096 | +0.00017 ± 0.00069 | 50.5% | +0.24 |\n"
        "| rank 1 | 4096 | +0.000358 ± 0.00071 | 50.1% | +0.51 |\n"
        "| all | 8192 | +0.000264 ± 0.00049 | 50.3% | +0.53 |\n\n"
    )
    # the script's words, escaped: no mention, no reference, no comment, no cell split
    assert (
        "**Conclusion:** the sign is noise at this sample size (pooled z = +0.53) "
        "@\u2060team #\u2060506 &lt;\\!-- \\|"
    ) in section
    assert "as with `fixed`." in comment  # a measurement is not a clean run


@pytest.mark.parametrize(
    "bad",
    [None, "z = 0.5", {"rows": [], "conclusion": "noise"},
     {"rows": [{**SIGNED_MEASUREMENT["rows"][0], "z": float("nan")}], "conclusion": "noise"},
     {"rows": SIGNED_MEASUREMENT["rows"]}],
    ids=["none", "text", "no-rows", "nan", "no-conclusion"],
)  # fmt: skip
def test_a_malformed_measurement_is_shown_as_a_verdict(ppo_root: Path, bad: object) -> None:
    """Only a measurement the report can read whole gets the section; anything else stays a
    row of the results table, where its verdict and status are."""
    toml = ppo_root / "repros" / "ppo" / "repro.toml"
    toml.write_text(toml.read_text() + SIGNED_VARIANT)
    _recorded(ppo_root, bad)
    comment = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text()
    assert "### Measurements" not in comment
    assert "| `signed` | ℹ️ clean |" in comment


def test_only_and_since_leave_cells_out(ppo_root: Path) -> None:
    save_record(ppo_root, "fixed", "clean", started="2026-12-02T00:00:00Z")
    only = report.write_report(ppo_root, "ppo", report.ReportOptions(only=("broken",),
                               collect_env=False))  # fmt: skip
    comment = only.comment.read_text()
    assert "`fixed`" not in comment and "Matrix: 2 cells" in comment
    assert "3 left out by --only/--since" in comment
    since = datetime(2026, 12, 1, tzinfo=UTC)
    late = report.write_report(ppo_root, "ppo", report.ReportOptions(since=since,
                               collect_env=False)).comment.read_text()  # fmt: skip
    assert late.startswith("**Clean** with ") and "`broken`" not in late
    with pytest.raises(report.ReportError, match="leave none of the 6 cells"):
        report.write_report(ppo_root, "ppo", report.ReportOptions(only=("nope",)))


def test_a_sweep_is_the_headline(ppo_root: Path) -> None:
    _bisect_summary(
        ppo_root,
        kind="sweep",
        status="mapped",
        range=">=0.4.7,<=0.7.2",
        affected=">=0.4.7,<0.7.2",
        events=[{"introduced": "0.4.7"}, {"fixed": "0.7.2"}],
    )
    made = report.write_report(ppo_root, "ppo", NO_ENV)
    first = made.comment.read_text().split("\n\n")[0]
    assert first == (
        "**Affected:** trl `>=0.4.7,<=0.7.1` - introduced at or before 0.4.7 (the range's "
        "first release), fixed in 0.7.2 "
        "([0.7.1...0.7.2](https://github.com/huggingface/trl/compare/v0.7.1...v0.7.2)) "
        "(3 of 3 releases probed: 1 sweep, 3 cells)."
    )
    assert "releases_trl.png" in [p.name for p in made.plots]


def test_posting_to_the_upstream_issue_leaves_out_the_link_to_it(ppo_root: Path) -> None:
    toml = ppo_root / "repros" / "ppo" / "repro.toml"
    upstream = "https://github.com/huggingface/trl/issues/506"
    toml.write_text(toml.read_text().replace("https://example.invalid/issues/1", upstream))
    elsewhere = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text()
    assert "(https://github.com/huggingface/trl/issues/506)" in elsewhere
    options = report.ReportOptions(collect_env=False, posting_to="huggingface/trl#506")
    there = report.write_report(ppo_root, "ppo", options).comment.read_text()
    assert "issues/506" not in there


def test_step_summary_gets_the_comment(ppo_root: Path, tmp_path: Path) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    options = report.ReportOptions(collect_env=False, step_summary=summary)
    made = report.write_report(ppo_root, "ppo", options)
    text = summary.read_text()
    assert text.startswith("earlier step\n") and made.comment.read_text().rstrip() in text


def test_seed_series_get_a_panel_per_variant(scratch_root: Path) -> None:
    fake_repro(scratch_root)
    same = {"order_seed0": [3, 1, 2], "order_seed1": [3, 1, 2]}
    own = {"order_seed0": [3, 1, 2], "order_seed1": [2, 3, 1]}
    save_record(scratch_root, "broken", "reproduced", kl=0.1, series=same)
    save_record(scratch_root, "fixed", "clean", series=own)
    made = report.write_report(scratch_root, "ppo", NO_ENV)
    md = made.markdown.read_text()
    assert "order per seed, one panel per variant - default" in md
    assert plots.series_families(same) == {"order": {"seed0": [3.0, 1.0, 2.0],
                                                     "seed1": [3.0, 1.0, 2.0]}}  # fmt: skip


def test_newest_record_per_cell_wins(ppo_root: Path) -> None:
    save_record(ppo_root, "fixed", "reproduced", kl=0.3, started="2026-12-01T00:00:00Z")
    # the same cell under an older slug spelling, older: ignored
    save_record(ppo_root, "fixed", "clean", folder="fixed_old", started="2026-01-01T00:00:00Z")
    loaded = report.load_records(RecordStore(results_dir(ppo_root)), "ppo")
    fixed = [r for r in loaded.records if r.label == "fixed"]
    assert len(fixed) == 1 and fixed[0].verdict == "reproduced"
    md = report.write_report(ppo_root, "ppo", NO_ENV).markdown.read_text()
    assert "| `fixed` | ❌ reproduced (expected clean) |" in md
    assert "**Not as expected:** `fixed` gave reproduced (expected clean)." in md
    assert "### Problems" in md and "step 0 kl=0.1" in md  # the log tail of the mismatch


def test_no_results_is_a_clear_error(scratch_root: Path) -> None:
    fake_repro(scratch_root)
    with pytest.raises(report.ReportError, match=r"no results for ppo under .*reprobox run ppo"):
        report.write_report(scratch_root, "ppo", NO_ENV)
    assert not (results_dir(scratch_root) / "ppo").exists()


def test_unknown_repro_is_bad_input(scratch_root: Path) -> None:
    with pytest.raises(BadInput, match="unknown repro 'nope'"):
        report.write_report(scratch_root, "nope", NO_ENV)


def test_record_of_another_repro_is_refused(ppo_root: Path) -> None:
    stray = save_record(ppo_root, "broken", "reproduced", folder="stray")
    data = json.loads((Path(stray.dir) / "record.json").read_text())
    data["repro"] = "lm_head"
    (Path(stray.dir) / "record.json").write_text(json.dumps(data))
    with pytest.raises(report.ReportError, match=r"record of repro 'lm_head', not 'ppo'"):
        report.write_report(ppo_root, "ppo", NO_ENV)
    assert not (results_dir(ppo_root) / "ppo" / "_report").exists()


def test_half_written_record_falls_back_to_the_older_run(ppo_root: Path) -> None:
    newer = save_record(ppo_root, "broken", "clean", started="2026-12-01T00:00:00Z")
    path = Path(newer.dir) / "record.json"
    path.write_text(path.read_text()[:40])  # cut mid-write
    made = report.write_report(ppo_root, "ppo", NO_ENV)
    assert any("half-written" in s and str(path) in s for s in made.skipped)
    md = made.markdown.read_text()
    assert "| `broken` | ✅ reproduced |" in md  # the older, complete record
    assert "skipped" in md and "half-written" in md
    assert path.read_text()  # nothing on disk was repaired or removed


def test_only_half_written_records_is_a_clear_error(scratch_root: Path) -> None:
    fake_repro(scratch_root)
    record = save_record(scratch_root, "broken", "reproduced")
    (Path(record.dir) / "record.json").write_text('{"schema": 1, "repro": ')
    with pytest.raises(report.ReportError, match=r"no usable records for ppo .*1 unreadable"):
        report.write_report(scratch_root, "ppo", NO_ENV)


def test_a_previous_report_is_replaced_a_foreign_folder_refused(ppo_root: Path) -> None:
    first = report.write_report(ppo_root, "ppo", NO_ENV)
    (first.dir / "stale.txt").write_text("from the previous report")
    second = report.write_report(ppo_root, "ppo", NO_ENV)
    assert second.dir == first.dir and not (second.dir / "stale.txt").exists()

    mine = ppo_root / "notes"
    mine.mkdir()
    (mine / "keep.md").write_text("my notes")
    with pytest.raises(report.ReportError, match="is not a reprobox report"):
        report.write_report(ppo_root, "ppo", report.ReportOptions(out=mine, collect_env=False))
    assert (mine / "keep.md").read_text() == "my notes" and len(list(mine.iterdir())) == 1


def test_a_failing_build_leaves_the_previous_report(
    ppo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = report.write_report(ppo_root, "ppo", NO_ENV)
    before = _tree_digest(first.dir)

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(plots, "metric_bars", boom)
    with pytest.raises(RuntimeError):
        report.write_report(ppo_root, "ppo", NO_ENV)
    assert _tree_digest(first.dir) == before
    leftovers = [p.name for p in first.dir.parent.iterdir() if p.name.startswith(("_tmp", "_old"))]
    assert leftovers == []


def test_collect_env_runs_in_the_recorded_environment(ppo_root: Path) -> None:
    """The interpreter is found beside the launcher that record.command names."""
    bin_dir = ppo_root / "envs" / "abc" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text('#!/bin/sh\necho "PyTorch version: 9.9.9 from $2"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    made = report.write_report(ppo_root, "ppo")
    md = made.markdown.read_text()
    assert "PyTorch version: 9.9.9 from torch.utils.collect_env" in md
    # one environment, one block
    assert (
        "In the environment of `broken`, `fixed`, `broken[trl=0.7.1]`, `broken[trl=0.7.2]` "
        "and 2 more:" in md
    )
    # absent packages: their reports are skipped with a word
    assert "`transformers env`, `accelerate env`, `trl env` and `ds_report` (not installed)" in md


def test_key_metrics_prefer_separating_ones(ppo_root: Path) -> None:
    records = report.load_records(RecordStore(results_dir(ppo_root)), "ppo").records
    rules = ["max_abs_kl_step0"]
    metrics = report.key_metrics(records, rules)
    assert metrics == ["max_abs_kl_step0", "max_abs_logp_diff"]
    assert report.charted_metrics(metrics, rules) == metrics


def test_series_families_group_ranks() -> None:
    families = plots.series_families({"kl_rank0": [1, 2], "kl_rank1": [3], "loss": [0.5], "x": []})
    assert families == {"kl": {"rank0": [1.0, 2.0], "rank1": [3.0]}, "loss": {"": [0.5]}}


def test_comment_fits_github_limit() -> None:
    big = "x" * 70_000
    sections = [
        report.Section("# title"),
        report.Section(big, drop=2, stub="*omitted*"),
        report.Section("tail"),
    ]
    text = report.comment_text(sections, "*plots elsewhere*", "<!-- marker -->")
    assert len(text) <= 65_536 and "*omitted*" in text and "tail" in text
    assert text.rstrip().endswith("*plots elsewhere*\n\n<!-- marker -->")


# ---- the command (handlers called directly, as cli.py would)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reprobox")
    report_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_report_command_prints_plain_lines_under_ci(
    ppo_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CI", "true")
    args = _parse("report", "ppo", "--no-env")
    assert args.handler(args) == 0
    err = capsys.readouterr().err
    assert "report ppo: 6 cells, 0 bisect(s)" in err
    assert "report: " in err and "report.md (6 cells, 4 plots)" in err
    assert "\x1b[" not in err  # no terminal control codes in a CI log


def _fake_gh(tmp_path: Path, auth_ok: bool = True, comment_ok: bool = True) -> Path:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    log = tmp_path / "gh.log"
    gh.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        f'if [ "$1" = auth ]; then exit {0 if auth_ok else 1}; fi\n'
        + (
            'echo "https://example.invalid/o/r/issues/5#issuecomment-1"\n'
            if comment_ok
            else 'echo "HTTP 403: Resource not accessible" >&2; exit 1\n'
        )
    )
    gh.chmod(0o755)
    return bin_dir


def test_post_with_gh(ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{_fake_gh(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    args = _parse("report", "ppo", "--no-env", "--post", "o/r#5")
    assert args.handler(args) == 0
    calls = (tmp_path / "gh.log").read_text().splitlines()
    comment = results_dir(ppo_root) / "ppo" / "_report" / "comment.md"
    assert calls == ["auth status", f"issue comment 5 --repo o/r --body-file {comment}"]


def test_post_without_gh_names_the_command(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    args = _parse("report", "ppo", "--no-env", "--post", "o/r#5")
    with pytest.raises(BadInput, match=r"gh .* not installed; to post, run: gh issue comment 5"):
        args.handler(args)
    assert (results_dir(ppo_root) / "ppo" / "_report" / "report.md").is_file()


@pytest.mark.parametrize(
    ("auth_ok", "comment_ok", "message"),
    [(False, True, "gh is not logged in"), (True, False, "HTTP 403: Resource not accessible")],
)
def test_post_failures_are_one_line(
    ppo_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    auth_ok: bool,
    comment_ok: bool,
    message: str,
) -> None:
    bin_dir = _fake_gh(tmp_path, auth_ok, comment_ok)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    args = _parse("report", "ppo", "--no-env", "--post", "o/r#5")
    with pytest.raises(BadInput, match=message) as caught:
        args.handler(args)
    assert "\n" not in str(caught.value)


def test_bad_post_target_fails_before_any_work(ppo_root: Path) -> None:
    args = _parse("report", "ppo", "--post", "not-a-target")
    with pytest.raises(BadInput, match="expected OWNER/REPO#NUMBER"):
        args.handler(args)
    assert not (results_dir(ppo_root) / "ppo" / "_report").exists()


def test_dry_run_prints_exactly_what_would_be_posted(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("PATH", f"{_fake_gh(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    args = _parse("report", "ppo", "--no-env", "--post", "o/r#5", "--dry-run")
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    comment = results_dir(ppo_root) / "ppo" / "_report" / "comment.md"
    assert out == comment.read_text()
    assert "dry run: would post" in err and "gh issue comment 5 --repo o/r" in err
    assert not (tmp_path / "gh.log").exists()  # gh was never called


def _fake_gh_api(tmp_path: Path, found: str) -> Path:
    """A gh that logs its calls and answers the `gh api` calls of --edit-last."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    log = tmp_path / "gh.log"
    gh.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'case "$1 $2" in\n'
        '  "auth status") exit 0 ;;\n'
        '  "api user") echo me ;;\n'
        f'  "api --paginate") echo "{found}" ;;\n'
        '  "api --method") echo "https://example.invalid/o/r/issues/5#issuecomment-77" ;;\n'
        '  *) echo "https://example.invalid/o/r/issues/5#issuecomment-new" ;;\n'
        "esac\n"
    )
    gh.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("found", ["77", ""])
def test_edit_last_updates_the_previous_comment(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: str
) -> None:
    monkeypatch.setenv("PATH", f"{_fake_gh_api(tmp_path, found)}{os.pathsep}{os.environ['PATH']}")
    args = _parse("report", "ppo", "--no-env", "--post", "o/r#5", "--edit-last")
    assert args.handler(args) == 0
    calls = (tmp_path / "gh.log").read_text().splitlines()
    comment = results_dir(ppo_root) / "ppo" / "_report" / "comment.md"
    assert calls[:2] == ["auth status", "api user --jq .login"]
    assert calls[2].startswith("api --paginate repos/o/r/issues/5/comments --jq ")
    assert 'select(.user.login == "me")' in calls[2]
    assert "<!-- reprobox-report: ppo -->" in calls[2]
    if found:  # the previous comment is replaced, no new one added
        assert calls[3:] == [
            f"api --method PATCH repos/o/r/issues/comments/77 -F body=@{comment} --jq .html_url"
        ]
    else:  # none yet: a new comment
        assert calls[3:] == [f"issue comment 5 --repo o/r --body-file {comment}"]


def test_dry_run_needs_a_target(ppo_root: Path) -> None:
    args = _parse("report", "ppo", "--dry-run")
    with pytest.raises(BadInput, match="go with --post"):
        args.handler(args)


def test_the_commit_answer_stands_beside_the_release_answer(ppo_root: Path) -> None:
    _bisect_summary(ppo_root, kind="release")
    folder = results_dir(ppo_root) / "ppo" / "_bisect" / "20261130T010000-def"
    folder.mkdir(parents=True)
    sha = "c02ce6d3f5cd9809875274e277685547e4cedca6"
    commit = {
        "sha": sha,
        "subject": "Extend DeepSpeed integration to ZeRO-{1,2,3} (#758)",
        "author": "A. Maintainer",
        "pr": 758,
        "link": f"https://github.com/huggingface/trl/commit/{sha}",
        "pr_link": "https://github.com/huggingface/trl/pull/758",
    }
    summary = {
        "kind": "commit", "status": "found", "package": "trl", "variant": "broken",
        "good": "v0.7.2", "bad": "v0.7.1", "first": sha, "last_start": "0" * 40,
        "start_verdict": "reproduced", "end_verdict": "clean", "versions": [],
        "result": f"first clean commit: {sha[:12]} (#758)", "commit": commit,
    }  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    comment = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text()
    assert "**Fixed in trl 0.7.2:**" in comment
    assert f"[{sha[:12]}](https://github.com/huggingface/trl/commit/{sha})" in comment
    assert "](https://github.com/huggingface/trl/pull/758)" in comment  # the PR, linked


def test_post_publishes_the_files_the_comment_cannot_hold_as_a_secret_gist(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repro file too big for GitHub's 65,536 characters goes to a secret gist (scrubbed)
    that the posted comment links; a small file the commands need stays inline."""
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    big = ppo_root / "repros" / "ppo" / "big_helper.py"
    big.write_text(f'TOKEN = "{token}"\n' + "# padding\n" * 7000)
    _imports(ppo_root, "big_helper")
    (ppo_root / "repros" / "ppo" / "zero.yaml").write_text("zero_stage: 2\n")
    monkeypatch.setenv("PATH", f"{_fake_gh(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    args = _parse("report", "ppo", "--no-env", "--post", "o/r#5")
    assert args.handler(args) == 0
    report = results_dir(ppo_root) / "ppo" / "_report"
    calls = (tmp_path / "gh.log").read_text().splitlines()
    gist = report / "gist" / "big_helper.py"
    assert calls[0] == f"gist create --desc reprobox: files of the ppo reproduction {gist}"
    assert token not in gist.read_text() and "[REDACTED]" in gist.read_text()
    comment = (report / "comment.md").read_text()
    assert len(comment) <= 65_536
    assert (
        "*The files not shown above (`big_helper.py`) are in a secret gist: "
        "https://example.invalid/o/r/issues/5#issuecomment-1*"
    ) in comment
    assert "zero_stage: 2" in comment  # the small config stays inline
    assert "reprobox bundle" not in comment and token not in comment
    assert comment.rstrip().endswith("<!-- reprobox-report: ppo -->")


def _imports(root: Path, module: str) -> None:
    """The fake script imports `module` (so a pasted comment needs it)."""
    script = root / "repros" / "ppo" / "ppo.py"
    script.write_text(script.read_text() + f"import {module}\n")


def test_without_post_the_comment_names_what_it_leaves_out(
    ppo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file the script imports and the comment has no room for: the comment says where it
    will be, the terminal says the comment does not run as written, and a copy waits
    beside the report (what `--post` publishes, also from a CI artifact)."""
    (ppo_root / "repros" / "ppo" / "big_helper.py").write_text("# padding\n" * 7000)
    _imports(ppo_root, "big_helper")
    args = _parse("report", "ppo", "--no-env")
    assert args.handler(args) == 0
    report = results_dir(ppo_root) / "ppo" / "_report"
    comment = (report / "comment.md").read_text()
    assert "*`big_helper.py` (7000 lines, 70,000 characters) is not shown" in comment
    assert "*The files not shown above (`big_helper.py`): their link is added here" in comment
    left = json.loads((report / "comment-omitted.json").read_text())
    assert left == [{"name": "big_helper.py", "path": "files/big_helper.py"}]
    assert (report / "files" / "big_helper.py").read_text() == "# padding\n" * 7000
    err = capsys.readouterr().err
    assert "reprobox: warning: comment.md has no room for big_helper.py" in " ".join(err.split())


def test_a_file_no_shown_command_needs_is_not_in_the_comment(ppo_root: Path) -> None:
    """The comment holds the script's import closure and the configs its commands name:
    a helper nothing imports and a config no shown variant launches with stay out; a
    module named only inside importlib.import_module(...) and a data file named as a
    string are in."""
    folder = ppo_root / "repros" / "ppo"
    (folder / "unused_helper.py").write_text("UNUSED = 1\n")
    (folder / "other_gpu.yaml").write_text("num_processes: 1\n")
    (folder / "gen_a.py").write_text("import common_bit\n")
    (folder / "common_bit.py").write_text("BIT = 1\n")
    (folder / "table.json").write_text("{}\n")
    script = folder / "ppo.py"
    script.write_text(
        script.read_text()
        + "import importlib\nimportlib.import_module({'a': 'gen_a'}['a'])\n"
        + "open(__file__.rsplit('/', 1)[0] + '/' + 'table.json')\n"
    )
    comment = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text()
    shown = re.findall(r"<summary><code>([^<]+)</code>", comment)
    assert shown == ["ppo.py", "common_bit.py", "gen_a.py", "table.json", "zero.yaml"]


def test_the_comment_holds_what_the_shown_runs_read(scratch_root: Path) -> None:
    """When every shown variant's run noted the files it read (run/reads.py), the comment
    holds those (at the pins shown), not every module the script could pick; when one
    did not (an older record, another back end), the static closure stands in."""
    folder = fake_repro(scratch_root)
    for name in ("gen_a", "gen_b", "gen_c"):
        (folder / f"{name}.py").write_text("X = 1\n")
    script = folder / "ppo.py"
    script.write_text(
        script.read_text()
        + "import importlib\nimportlib.import_module({'a': 'gen_a', 'b': 'gen_b', "
        + "'c': 'gen_c'}['a'])\n"
    )
    broken = save_record(scratch_root, "broken", "reproduced", kl=0.1)
    fixed = save_record(scratch_root, "fixed", "clean")
    broken.files_read = ["ppo.py", "gen_a.py", "zero.yaml"]
    broken.save()

    def shown() -> list[str]:
        comment = report.write_report(scratch_root, "ppo", NO_ENV).comment.read_text()
        return re.findall(r"<summary><code>([^<]+)</code>", comment)

    assert shown() == ["ppo.py", "gen_a.py", "gen_b.py", "gen_c.py", "zero.yaml"]  # static
    fixed.files_read = ["ppo.py", "gen_b.py", "zero.yaml"]
    fixed.save()
    assert shown() == ["ppo.py", "gen_a.py", "gen_b.py", "zero.yaml"]


def test_as_built_posts_a_ci_artifacts_report_with_its_gist(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's post job holds only the exported artifact: `report --as-built --post` posts its
    comment.md as it is and first publishes the files it has no room for from the copies
    beside it, so the posted comment links them (a plain `gh issue comment` would not)."""
    (ppo_root / "repros" / "ppo" / "big_helper.py").write_text("# padding\n" * 7000)
    _imports(ppo_root, "big_helper")
    args = _parse("report", "ppo", "--no-env")
    assert args.handler(args) == 0
    exported = tmp_path / "export"
    assert export.export(results_dir(ppo_root), ["ppo"], exported).files
    (ppo_root / "repros" / "ppo" / "big_helper.py").unlink()  # only the artifact has it
    monkeypatch.setenv("REPROBOX_RESULTS", str(exported))
    monkeypatch.setenv("PATH", f"{_fake_gh(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    args = _parse("report", "ppo", "--as-built", "--post", "o/r#5")
    assert args.handler(args) == 0
    built = exported / "ppo" / "_report"
    calls = (tmp_path / "gh.log").read_text().splitlines()
    assert (
        calls[0]
        == f"gist create --desc reprobox: files of the ppo reproduction {built}/gist/big_helper.py"
    )
    assert calls[-1] == f"issue comment 5 --repo o/r --body-file {built / 'comment.md'}"
    comment = (built / "comment.md").read_text()
    assert "(`big_helper.py`) are in a secret gist: https://example.invalid/" in comment
    assert "their link is added here" not in comment


def test_as_built_without_a_report_is_one_line(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "empty"))
    args = _parse("report", "ppo", "--as-built", "--post", "o/r#5")
    with pytest.raises(BadInput, match=r"--as-built: .* holds no comment\.md"):
        args.handler(args)
    args = _parse("report", "ppo", "--as-built")
    with pytest.raises(BadInput, match="--as-built goes with --post"):
        args.handler(args)


def test_one_matrix_cell_and_the_upstream_paragraph(ppo_root: Path) -> None:
    """ "Matrix: 1 cell", not "1 cells"; the upstream line and the fixes line are two
    paragraphs (markdown joins adjacent lines: the link ran into its sources)."""
    toml = ppo_root / "repros" / "ppo" / "repro.toml"
    toml.write_text(
        toml.read_text().replace(
            'script = "ppo.py"',
            'script = "ppo.py"\nfix_links = ["https://example.invalid/pull/2"]',
        )
    )
    wanted = report.ReportOptions(collect_env=False, only=("broken?trl=0.7.1?",))
    made = report.write_report(ppo_root, "ppo", wanted)
    text = made.markdown.read_text()
    assert "<summary>Matrix: 1 cell</summary>" in text
    assert (
        "Upstream: https://example.invalid/issues/1\n\n"
        "Fixes and related: https://example.invalid/pull/2\n"
    ) in text


def test_a_bisect_the_affected_line_already_answers_is_not_said_twice(ppo_root: Path) -> None:
    """A sweep and then a release bisect of the same configuration: the "Affected" line says
    "fixed in 0.7.2" with the compare link; the bisect's own line would say it again."""
    _bisect_summary(
        ppo_root, kind="sweep", status="mapped", range=">=0.4.7,<=0.7.2",
        affected=">=0.4.7,<0.7.2", events=[{"introduced": "0.4.7"}, {"fixed": "0.7.2"}],
    )  # fmt: skip
    sweep = results_dir(ppo_root) / "ppo" / "_bisect" / "20261130T000000-abc" / "summary.json"
    release = json.loads(sweep.read_text())
    for key in ("kind", "range", "affected", "events"):
        release.pop(key)
    release["status"] = "found"
    later = sweep.parent.with_name("20261130T010000-def")
    later.mkdir()
    (later / "summary.json").write_text(json.dumps(release))
    comment = report.write_report(ppo_root, "ppo", NO_ENV).comment.read_text()
    head = comment.split("### Expected behavior")[0]
    assert head.count("compare/v0.7.1...v0.7.2") == 1, head
    assert head.startswith("**Affected:** trl") and "**Fixed in trl 0.7.2:**" not in head
