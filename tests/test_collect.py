"""Results made elsewhere come home through the one judge and the one newest-record rule:
the regressions of the redesign issue (a variant's own rule ignored by collect; `table` and
`report` disagreeing after an import), and untrusted pod folders: a forged record.json, a
forged expectation, a param the repro does not define, a missing exit code, a start time
in the future, all through `reprobox collect` and `reprobox table`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_report import NO_ENV, fake_repro, save_record

from conftest import newest_records, reprobox
from reprobox.core.cells import Cell
from reprobox.core.judge import Status
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore
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
    _as_run_folder(old, 0)
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


# -- forged outputs, through the command line ----------------------------------------------

KL_HIGH = {"schema": 1, "variant": "fixed", "verdict": "reproduced", "reason": "",
           "metrics": {"max_abs_kl_step0": 0.3}}  # fmt: skip


def _as_run_folder(record: Record, launcher_code: int) -> Record:
    """What a harness run folder holds beside its record: the script's result.json, and the
    launcher's exit status in the record."""
    (Path(record.dir) / "result.json").write_text(json.dumps(record.result))
    data = json.loads((Path(record.dir) / "record.json").read_text())
    data.update(exits=[{"rank": None, "code": launcher_code}], returncode=launcher_code)
    (Path(record.dir) / "record.json").write_text(json.dumps(data))
    return record


def _table_row(variant: str) -> list[str]:
    """`table`'s row of the variant; the table exits 1: a verdict missed its expectation."""
    table = reprobox("table", "ppo", "--format", "plain")
    assert table.returncode == 1 and "reproduced, expected clean" in table.stderr, table.stderr
    [row] = [line.split() for line in table.stdout.splitlines() if line.split()[1:2] == [variant]]
    return row


def _forged_record(folder: Path, cell: Cell, **claims: object) -> None:
    """A record.json that says what the forger wants, beside the real output."""
    record = Record.for_cell(cell, folder)
    record.status, record.verdict, record.exit_code = Status.MATCH, Verdict.CLEAN, 0
    for name, value in claims.items():
        setattr(record, name, value)
    (folder / "record.json").write_text(json.dumps(record.to_json()))


def test_a_pods_forged_record_is_not_trusted(ppo_root: Path, tmp_path: Path) -> None:
    """The pod's result says reproduced and it exited 1; its record.json says clean match."""
    folder = _pod_output(ppo_root, tmp_path / "out", "fixed", KL_HIGH, 1)
    cell = Cell.from_identity(json.loads((folder / "cell.json").read_text()))
    _forged_record(folder, cell, reason="forged")
    done = reprobox("collect", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "ppo fixed: reproduced (expected clean) MISMATCH" in done.stderr, done.stderr
    row = _table_row("fixed")
    assert row[3] == "reproduced" and "match" not in row, row
    [record] = [r for r in newest_records(ppo_root / "results", "ppo").values()]
    assert (record["verdict"], record["status"], record["reason"]) == (
        "reproduced", "mismatch", "max_abs_kl_step0=0.3 > 0")  # fmt: skip


def test_a_copied_run_folder_is_judged_again(ppo_root: Path, tmp_path: Path) -> None:
    """Copied from another machine: its record.json says clean and expected reproduced (a
    match); its result says reproduced, its launcher exited 1, and the repro expects clean."""
    old = save_record(ppo_root, "fixed", "reproduced", kl=0.3, folder="cpu-fixed")
    _as_run_folder(old, 1)
    data = json.loads((Path(old.dir) / "record.json").read_text())
    data.update(verdict="clean", status="match", expect="reproduced", exit_code=0)
    (Path(old.dir) / "record.json").write_text(json.dumps(data))
    elsewhere = tmp_path / "other-machine" / "ppo" / "cpu-fixed" / Path(old.dir).name
    elsewhere.parent.mkdir(parents=True)
    Path(old.dir).rename(elsewhere)
    done = reprobox("collect", str(tmp_path / "other-machine"))
    assert done.returncode == 0, done.stderr
    assert "ppo fixed: reproduced (expected clean) MISMATCH" in done.stderr, done.stderr
    assert _table_row("fixed")[3] == "reproduced"


def test_a_copied_record_without_exit_codes_is_an_error(ppo_root: Path, tmp_path: Path) -> None:
    old = save_record(ppo_root, "fixed", "clean", folder="cpu-fixed")
    (Path(old.dir) / "result.json").write_text(json.dumps(old.result))  # no exits recorded
    elsewhere = tmp_path / "copy" / "ppo" / "cpu-fixed" / Path(old.dir).name
    elsewhere.parent.mkdir(parents=True)
    Path(old.dir).rename(elsewhere)
    done = reprobox("collect", str(tmp_path / "copy"))
    assert done.returncode == 0, done.stderr
    [record] = newest_records(ppo_root / "results", "ppo").values()
    assert (record["status"], record["verdict"], record["exit_code"]) == ("error", None, 4)
    assert record["reason"].startswith("its record lists no exit status")


def test_a_param_the_repro_does_not_define_is_refused(ppo_root: Path, tmp_path: Path) -> None:
    folder = _pod_output(ppo_root, tmp_path / "out", "fixed", KL_HIGH, 0)
    cell = json.loads((folder / "cell.json").read_text())
    planted = Cell.from_identity({**cell, "params": {"evil": "1"}})
    (folder / "cell.json").write_text(json.dumps({**cell, "params": {"evil": "1"}}))
    folder.rename(folder.with_name(planted.slug))  # named for the cell it claims to be
    done = reprobox("collect", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("reprobox: error:")]
    assert error.endswith("param 'evil' is not one that ppo defines (it defines no params)")
    assert not (ppo_root / "results" / "ppo").exists()


def test_a_pod_without_an_exit_code_or_from_the_future(ppo_root: Path, tmp_path: Path) -> None:
    """A result alone is no verdict; a start time after now would be the newest forever."""
    result = {**KL_HIGH, "verdict": "clean", "metrics": {"max_abs_kl_step0": 0.0}}
    folder = _pod_output(ppo_root, tmp_path / "out" / "a", "fixed", result, 0)
    (folder / "exit_code").unlink()
    future = _pod_output(ppo_root, tmp_path / "out" / "b", "broken", KL_HIGH, 1)
    cell = json.loads((future / "cell.json").read_text())
    (future / "cell.json").write_text(json.dumps({**cell, "started_at": "2099-01-01T00:00:00Z"}))
    done = reprobox("collect", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (
        "not imported" in done.stderr
        and "started_at 2099-01-01T00:00:00Z is in the future" in done.stderr
    )
    [record] = newest_records(ppo_root / "results", "ppo").values()
    assert (record["label"], record["status"], record["verdict"]) == ("fixed", "error", None)
    assert "the pod wrote no readable exit_code" in record["reason"]


def test_collect_scrubs_the_logs_it_keeps(
    ppo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's launch.log holds what its ranks printed: kept under results/, it is scrubbed
    as a run's own log is (it was copied as it came: issue 35)."""
    monkeypatch.setenv("WANDB_API_KEY", "pod-secret-value-7731")
    result = {"schema": 1, "variant": "fixed", "verdict": "clean", "reason": "",
              "metrics": {"max_abs_kl_step0": 0.0}}  # fmt: skip
    folder = _pod_output(ppo_root, tmp_path / "out", "fixed", result, 0)
    token = "hf_" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4"
    (folder / "launch.log").write_text(
        f"$ accelerate launch ppo.py\nlogin with {token}\nkey pod-secret-value-7731\n"
    )
    [record] = collect(tmp_path / "out", ppo_root, RecordStore(ppo_root / "results")).records
    kept = (Path(record.dir) / "launch.log").read_text()
    assert token not in kept and "pod-secret-value-7731" not in kept, kept
    assert "[REDACTED]" in kept and "accelerate launch ppo.py" in kept
    assert record.status == "match"
