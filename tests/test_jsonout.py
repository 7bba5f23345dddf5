"""`--json` on run, table, bisect and sweep through the real CLI: stdout is one JSON document
(json.loads of all of it), made of the records as record.json holds them and the summary as
summary.json holds it; the exit code is the one without --json; docs/json.md is generated
from the models that make the documents. A bisect's and a sweep's documents are checked in
test_bisect_e2e, where each is replayed from the log of the live run the human output is
checked on (one real bisect, not two)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, reprobox
from reprobox.cli import jsonout
from reprobox.core.errors import ExitCode


def test_docs_json_md_is_what_the_models_say() -> None:
    """Regenerate with `python -m reprobox.cli.jsonout > docs/json.md`."""
    assert (ROOT / "docs" / "json.md").read_text() == jsonout.markdown()


def _on_disk(results: Path, doc: dict) -> list[dict]:
    return [json.loads((Path(r["dir"]) / "record.json").read_text()) for r in doc["records"]]


@pytest.mark.e2e
def test_run_and_table_print_the_records_as_they_lie_on_disk(toy_root: Path) -> None:
    done = reprobox("run", "toy", "--variant", "clean", "--variant", "wrong", "--json")
    assert done.returncode == ExitCode.FAILED, done.stderr  # wrong: reproduced, expected clean
    doc = json.loads(done.stdout)
    assert doc["command"] == "run" and doc["exit_code"] == done.returncode
    assert [r["label"] for r in doc["records"]] == ["clean", "wrong"]
    assert [r["verdict"] for r in doc["records"]] == ["clean", "reproduced"]
    assert doc["records"] == _on_disk(toy_root / "results", doc)
    assert doc["records"][0]["schema"] == 1
    # the human lines stay on stderr: the failure's reason is its last line
    assert done.stderr.splitlines()[-1].startswith("reprobox: error: toy wrong: reproduced")

    table = reprobox("table", "--json")
    assert table.returncode == ExitCode.FAILED, table.stderr
    shown = json.loads(table.stdout)
    assert shown["command"] == "table" and shown["exit_code"] == 1 and shown["notes"] == []
    assert {r["label"] for r in shown["records"]} == {"clean", "wrong"}
    assert shown["records"] == _on_disk(toy_root / "results", shown)


def test_an_error_before_running_prints_no_document(toy_root: Path) -> None:
    done = reprobox("table", "--json")
    assert done.returncode == ExitCode.BAD_INPUT and done.stdout == ""
    assert done.stderr.startswith("reprobox: error: no results on disk")


@pytest.mark.e2e
def test_bisect_dry_run_plans_and_launches_nothing(toy_root: Path) -> None:
    done = reprobox("bisect", "toy", "--dry-run")  # [bisect]: numpy 1.25.0 good, 1.26.4 bad
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "bisect toy --variant gate (cpu): 8 releases: 1.25.0, 1.25.1, 1.25.2, 1.26.0, 1.26.1, "
        "1.26.2, 1.26.3, 1.26.4"
    )
    assert lines[1] == "ends it checks first: 1.25.0 and 1.26.4"
    assert lines[2].startswith("expected probes: at most 9 (binary; 2 ends + ceil(log2(7 gaps))")
    assert lines[3] == "nothing launched (--dry-run)"
    planned = reprobox("bisect", "toy", "--dry-run", "--json", "--workers", "3")
    doc = json.loads(planned.stdout)
    assert doc["dry_run"] is True and doc["strategy"] == "multisection"
    assert doc["search_rounds"] == 2 and doc["candidates"][0] == "1.25.0"
    assert not (toy_root / "results").exists()  # no probe log, no run folder
    refused = reprobox("bisect", "toy", "--dry-run", "--commits", "--good", "a", "--bad", "b")
    assert refused.returncode == ExitCode.BAD_INPUT and refused.stdout == ""
