"""`reprobox export`: what CI uploads is a scrubbed copy of the newest results (issue 11, item
15): no secret a rank printed, no file a link points at, no older run, and still a results
folder the harness reads."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import reprobox
from reprobox.core.records import Record
from reprobox.core.scrub import Scrubber
from reprobox.core.settings import Settings
from reprobox.report import export as exporting

ENV_SECRET = "s3cr3t-only-in-the-environment-42"  # a value only the harness's env names
PLANTED = {
    "hf": "hf_abcdefghijklmnopqrstuvwxyz012345",
    "gh": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "url": "https://user:hunter2pass@index.example.invalid/simple",
    "curl": "curl -u alice:opensesame99 https://x.invalid",
    "aws": "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "env": f"the harness had {ENV_SECRET} in its environment",
}
SECRET_BITS = ["hf_abcdefghij", "ghp_abcdefghij", "hunter2pass", "opensesame99",
               "wJalrXUtnFEMI", ENV_SECRET, "/home/someone"]  # fmt: skip


def _record(results: Path, label: str, stamp: str, verdict: str = "clean") -> Path:
    run = results / "toy" / f"cpu-{label}" / stamp
    run.mkdir(parents=True)
    record = Record(
        repro="toy", variant=label, label=label, expect="clean", status="match",
        verdict=verdict, dir=str(run), started_at=stamp,
        command=["/home/someone/.cache/bin/python", "toy.py", "--hf-token", PLANTED["hf"]],
        result={"note": PLANTED["url"]},
    )  # fmt: skip
    record.save()
    return run


@pytest.fixture
def planted(toy_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Results of the toy repro whose logs, result and bisect log hold secrets."""
    monkeypatch.setenv("MY_SERVICE_TOKEN", ENV_SECRET)
    monkeypatch.setenv("HOME", "/home/someone")
    results = toy_root / "results"
    old = _record(results, "clean", "2026-01-01T00:00:00Z")
    (old / "launch.log").write_text("an older run: not exported\n")
    run = _record(results, "clean", "2026-02-01T00:00:00Z")
    (run / "launch.log").write_text("\n".join(PLANTED.values()) + "\n")
    (run / "rank0.log").write_text(f"Traceback: token={PLANTED['gh']}\n")
    (run / "result.json").write_text(json.dumps({"verdict": "clean", "cmd": PLANTED["curl"]}))
    netrc = toy_root / "netrc"
    netrc.write_text(f"machine x login u password {ENV_SECRET}\n")
    (run / "rank1.log").symlink_to(netrc)  # planted by a script: never followed
    (run / "model.pt").write_bytes(b"\x80\x02binary checkpoint")
    bisect = results / "toy" / "_bisect" / "abc"
    bisect.mkdir(parents=True)
    (bisect / "probes.jsonl").write_text(
        json.dumps({"key": "x", "reason": PLANTED["aws"]}) + "\n" + '{"torn": "' + PLANTED["hf"]
    )
    report = results / "toy" / "_report"
    report.mkdir()
    (report / "comment.md").write_text(f"see {PLANTED['url']}\n")
    (report / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    os.utime(old / "record.json", (time.time() - 100, time.time() - 100))
    return toy_root


def _all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_export_holds_no_secret_and_only_the_newest_runs(
    planted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = planted / "export"
    done = reprobox("export", "toy", "-o", str(out))
    assert done.returncode == 0, done.stderr
    raw = _all_bytes(planted / "results")
    assert all(bit.encode() in raw for bit in SECRET_BITS[:-1])  # they were there to find
    exported = _all_bytes(out)
    assert [bit for bit in SECRET_BITS if bit.encode() in exported] == []
    assert b"[REDACTED]" in exported

    cells = sorted(p.relative_to(out).as_posix() for p in out.rglob("record.json"))
    assert cells == ["toy/cpu-clean/2026-02-01T00:00:00Z/record.json"]  # the older run: no
    run = out / "toy" / "cpu-clean" / "2026-02-01T00:00:00Z"
    assert {p.name for p in run.iterdir()} == {"record.json", "launch.log", "rank0.log",
                                                "result.json"}  # fmt: skip
    assert "rank1.log: a link (never followed)" in done.stderr
    assert "model.pt: neither text nor an image" in done.stderr
    assert (out / "toy" / "_report" / "plot.png").read_bytes().startswith(b"\x89PNG")
    lines = (out / "toy" / "_bisect" / "abc" / "probes.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["key"] == "x" and len(lines) == 2  # the torn line, scrubbed

    # Still a results folder: the record loads, the table reads it.
    record = Record.load(run / "record.json")
    assert record.verdict == "clean" and record.command[2:] == ["--hf-token", "[REDACTED]"]
    monkeypatch.setenv("REPROBOX_RESULTS", str(out))
    table = reprobox("table", "toy", "--format", "plain")
    assert table.returncode == 0 and "clean" in table.stdout, table.stderr


def test_export_refuses_a_folder_inside_the_results_or_not_empty(planted: Path) -> None:
    settings = Settings.from_env()
    with pytest.raises(Exception, match="outside the results folder"):
        exporting.export(settings.results, ["toy"], settings.results / "toy" / "x")
    busy = planted / "busy"
    busy.mkdir()
    (busy / "file").write_text("")
    done = reprobox("export", "toy", "-o", str(busy))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"reprobox: error: -o {busy}: exists and is not an empty folder; choose another"
    ]
    assert reprobox("export", "nope", "-o", str(planted / "new")).returncode == 2


def test_json_stays_json_and_keys_are_scrubbed_too() -> None:
    scrub = Scrubber({"API_TOKEN": ENV_SECRET}, home="/home/someone")
    text = json.dumps({"cmd": ["x", "--token", "abc123def456"], ENV_SECRET: 1, "n": 2.5})
    data = json.loads(exporting.scrubbed(text, ".json", scrub))
    assert data == {"cmd": ["x", "--token", "[REDACTED]"], "[REDACTED]": 1, "n": 2.5}


def test_a_result_over_the_limit_is_never_read(planted: Path) -> None:
    """A result over the protocol's limit was never read by the judge; the export leaves it
    out, named, instead of scrubbing 11 MiB of it (issue 35)."""
    run = planted / "results" / "toy" / "cpu-clean" / "2026-02-01T00:00:00Z"
    with (run / "result.json").open("w") as out:
        out.write(
            '{"verdict": "clean", "blob": "' + "a" * (11 * 1024 * 1024) + PLANTED["hf"] + '"}'
        )
    done = reprobox("export", "toy", "-o", str(planted / "export"))
    assert done.returncode == 0, done.stderr
    assert "result.json: a result over 10.0 MiB, never read" in done.stderr
    exported = planted / "export" / "toy" / "cpu-clean" / "2026-02-01T00:00:00Z"
    assert not (exported / "result.json").exists()
    assert (exported / "record.json").is_file()
