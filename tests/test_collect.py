"""Results made elsewhere come home through the one judge and the one newest-record rule:
the regressions of the redesign issue (a variant's own rule ignored by collect; `table` and
`report` disagreeing after an import), and untrusted pod folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_report import NO_ENV, fake_repro, save_record

from conftest import reprobox
from reprobox.core.records import RecordStore
from reprobox.report import build as report
from reprobox.scaleout import jobs
from reprobox.scaleout.collect import collect

NEW_API = """
[variants.newapi]
expect = "clean"
description = "a later API that logs another metric"
verdict = { reproduced_if = [{ metric = "objective_kl", above = 0.0 }] }
"""


@pytest.fixture
def ppo_root(scratch_root: Path) -> Path:
    directory = fake_repro(scratch_root)
    toml = (directory / "repro.toml").read_text()
    head, tail = toml.split("[matrix]")
    (directory / "repro.toml").write_text(head + NEW_API + "\n[matrix]" + tail)
    return scratch_root


def _pod_output(root: Path, out: Path, variant: str, result: dict, code: int) -> Path:
    cell = next(c for c in jobs.job_cells(root, "ppo", "default", "cpu") if c.variant == variant)
    folder = out / cell.repro / cell.slug  # where the pod writes: /out/<repro>/<cell slug>
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps(cell.to_json()))
    (folder / "result.json").write_text(json.dumps(result))
    (folder / "exit_code").write_text(f"{code}\n")
    (folder / "launch.log").write_text("$ accelerate launch ppo.py\n")
    return folder


def test_collect_judges_with_the_variants_own_rule(ppo_root: Path, tmp_path: Path) -> None:
    result = {"schema": 1, "variant": "newapi", "verdict": "clean", "reason": "",
              "metrics": {"objective_kl": 0.0}}  # fmt: skip
    _pod_output(ppo_root, tmp_path / "out", "newapi", result, 0)
    found = collect(tmp_path / "out", ppo_root, RecordStore(ppo_root / "results"))
    assert found.skipped == []
    [record] = found.records
    # the repro-wide rule reads max_abs_kl_step0, which this variant does not log
    assert (record.verdict, record.status) == ("clean", "match"), record.reason
    assert record.decided_by == ["objective_kl"]


def test_collect_refuses_a_pod_whose_exit_contradicts_its_result(
    ppo_root: Path, tmp_path: Path
) -> None:
    result = {"schema": 1, "variant": "fixed", "verdict": "clean", "reason": "",
              "metrics": {"max_abs_kl_step0": 0.0}}  # fmt: skip
    _pod_output(ppo_root, tmp_path / "out", "fixed", result, -9)
    [record] = collect(tmp_path / "out", ppo_root, RecordStore(ppo_root / "results")).records
    assert record.status == "error" and "killed by SIGKILL" in record.reason


def test_table_and_report_agree_after_an_older_run_is_imported(
    ppo_root: Path, tmp_path: Path
) -> None:
    save_record(ppo_root, "broken", "reproduced", kl=0.2, started="2026-12-01T10:00:00Z")
    save_record(ppo_root, "fixed", "clean", started="2026-12-01T10:00:00Z")
    # another machine ran `broken` a month earlier and got clean; its folder comes home later
    elsewhere = tmp_path / "other-machine"
    old = save_record(ppo_root, "broken", "clean", expect="reproduced",
                      started="2026-11-01T10:00:00Z", folder="cpu-broken")  # fmt: skip
    target = elsewhere / "ppo" / "cpu-broken" / Path(old.dir).name
    target.parent.mkdir(parents=True)
    Path(old.dir).rename(target)
    found = collect(elsewhere, ppo_root, RecordStore(ppo_root / "results"))
    assert [r.verdict for r in found.records] == ["clean"]  # imported, written last

    table = reprobox("table", "ppo", "--format", "plain")
    broken_rows = [line for line in table.stdout.splitlines() if line.split()[1:2] == ["broken"]]
    assert len(broken_rows) == 1 and "reproduced" in broken_rows[0].split()[3], table.stdout
    records = report.load_records(RecordStore(ppo_root / "results"), "ppo").records
    assert [r.verdict for r in records if r.label == "broken"] == ["reproduced"]
    markdown = report.write_report(ppo_root, "ppo", NO_ENV).markdown.read_text()
    assert "Not as expected" not in markdown  # the imported older run is not the newest


def test_a_pod_folder_cannot_plant_links_or_paths(ppo_root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "netrc"
    secret.write_text("machine example.invalid password hunter2\n")
    result = {"schema": 1, "variant": "fixed", "verdict": "clean", "reason": "",
              "metrics": {"max_abs_kl_step0": 0.0}}  # fmt: skip
    folder = _pod_output(ppo_root, tmp_path / "out", "fixed", result, 0)
    cell = json.loads((folder / "cell.json").read_text())
    (folder / "cell.json").write_text(json.dumps({**cell, "slug": "../../../../escaped"}))
    (folder / "launch.log").unlink()
    os.symlink(secret, folder / "launch.log")
    [record] = collect(tmp_path / "out", ppo_root, RecordStore(ppo_root / "results")).records
    run_dir = Path(record.dir)
    assert run_dir.parent == ppo_root / "results" / "ppo" / "cpu-fixed"
    assert not (run_dir / "launch.log").exists()
    assert not list(tmp_path.rglob("escaped"))
    assert all("hunter2" not in p.read_text() for p in run_dir.iterdir())


def test_a_kubectl_cp_copy_of_one_repro_is_collected(ppo_root: Path, tmp_path: Path) -> None:
    """`kubectl cp <collector>:/out/ppo pulled` gives the cell folders at the top: the same
    tree one level down. The pod's start time is read from its cell.json, checked."""
    result = {"schema": 1, "variant": "fixed", "verdict": "clean", "reason": "",
              "metrics": {"max_abs_kl_step0": 0.0}}  # fmt: skip
    folder = _pod_output(ppo_root, tmp_path / "claim", "fixed", result, 0)
    cell = json.loads((folder / "cell.json").read_text())
    (folder / "cell.json").write_text(json.dumps({**cell, "started_at": "2026-10-01T08:00:00Z"}))
    pulled = tmp_path / "claim" / "ppo"  # as kubectl cp leaves it
    [record] = collect(pulled, ppo_root, RecordStore(ppo_root / "results")).records
    assert (record.verdict, record.started_at) == ("clean", "2026-10-01T08:00:00Z")
    (folder / "cell.json").write_text(json.dumps({**cell, "started_at": "yesterday"}))
    [record] = collect(pulled, ppo_root, RecordStore(ppo_root / "results")).records
    assert record.started_at != "yesterday" and record.started_at.endswith("Z")


def test_a_pod_folder_that_is_not_its_cells_or_too_big_is_skipped(
    ppo_root: Path, tmp_path: Path
) -> None:
    result = {"schema": 1, "variant": "fixed", "verdict": "clean", "reason": "",
              "metrics": {"max_abs_kl_step0": 0.0}}  # fmt: skip
    folder = _pod_output(ppo_root, tmp_path / "out" / "a", "fixed", result, 0)
    folder.rename(folder.with_name("cpu-broken"))  # fixed's output posing as broken's
    big = _pod_output(ppo_root, tmp_path / "out" / "b", "broken", result, 0)
    cell = json.loads((big / "cell.json").read_text())
    (big / "cell.json").write_text(json.dumps({**cell, "pad": "x" * (2 * 2**20)}))
    found = collect(tmp_path / "out", ppo_root, RecordStore(ppo_root / "results"))
    assert found.records == []
    assert sorted(line.split(": ", 1)[1] for line in found.skipped) == [
        "cell.json is larger than 1024 KiB",
        "cell.json is of cell cpu-fixed, not of this folder",
    ]
