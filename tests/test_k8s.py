"""Scale-out: the Kubernetes Indexed Job manifest, the pod's own script run locally, importing
its output as records, and the job lists for GitHub Actions (matrix, canary)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version
from test_report import fake_repro, save_record

from reprobox.cli import scaleout as scaleout_cli
from reprobox.core.errors import BadInput
from reprobox.core.records import RECORD_FILE, Record, RecordStore
from reprobox.envs.index import Release
from reprobox.scaleout import jobs, k8s
from reprobox.scaleout.collect import collect


@pytest.fixture
def ppo_root(scratch_root: Path) -> Path:
    fake_repro(scratch_root)
    return scratch_root


def results_dir(root: Path) -> Path:
    """The results folder of a scratch checkout (conftest points REPROBOX_RESULTS there)."""
    return root / "results"


def _objects(text: str) -> list[dict]:
    return [o for o in yaml.safe_load_all(text) if o]


def _cells_of(objects: list[dict]) -> list[dict]:
    cells = []
    for config_map in (o for o in objects if o["kind"] == "ConfigMap"):
        cells += json.loads(config_map["data"]["cells.json"])
    return cells


def test_manifest_has_one_pod_per_cell(ppo_root: Path) -> None:
    cells = jobs.job_cells(ppo_root, "ppo", "all", "gpu")
    assert [c.label for c in cells] == [
        "broken", "fixed", "broken[trl=0.7.1]", "broken[trl=0.7.2]",
        "fixed[trl=0.7.1]", "fixed[trl=0.7.2]",
    ]  # fmt: skip
    objects = _objects(k8s.dump(k8s.manifest(cells, k8s.K8sOptions(image_prefix="reg/rb"))))
    job_list = [o for o in objects if o["kind"] == "Job"]
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    # every cell exactly once, with its global index
    listed = _cells_of(objects)
    assert sorted(c["index"] for c in listed) == list(range(len(cells)))
    assert sorted(c["label"] for c in listed) == sorted(c.label for c in cells)
    for job in job_list:
        spec = job["spec"]
        pod = spec["template"]["spec"]
        container = pod["containers"][0]
        config = maps[next(v for v in pod["volumes"] if v["name"] == "cells")["configMap"]["name"]]
        mine = json.loads(config["data"]["cells.json"])
        assert spec["completionMode"] == "Indexed"
        assert spec["completions"] == len(mine) == spec["parallelism"]
        assert pod["restartPolicy"] == "Never"
        assert {e["name"] for e in container["env"]} == {"JOB_COMPLETION_INDEX"}
        assert "JOB_COMPLETION_INDEX" in container["command"][-1]
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/out", "/etc/reprobox"}
        claim = next(v for v in pod["volumes"] if v["name"] == "out")
        assert claim["persistentVolumeClaim"]["claimName"] == "reprobox-results"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
        # one image per environment: every cell of a Job shares its tag
        assert {f"reg/rb/ppo:{c['image_tag']}" for c in mine} == {container["image"]}
        assert pod["securityContext"]["runAsNonRoot"] is True
    # what a cell runs: the image's launcher, then the protocol arguments
    broken = next(c for c in listed if c["label"] == "broken[trl=0.7.1]")
    assert broken["launch"] == [
        "/opt/venv/bin/accelerate", "launch", "--config_file", "/opt/repro/zero.yaml",
        "--num_processes", "2", "--main_process_port", "29500", "/opt/repro/ppo.py",
    ]  # fmt: skip
    assert broken["args"] == ["--variant", "broken"]
    assert broken["image_tag"] == "broken-trl-0.7.1-gpu"
    assert broken["env"] == {"OMP_NUM_THREADS": "1"}


def test_one_image_means_one_job(ppo_root: Path) -> None:
    cells = jobs.job_cells(ppo_root, "ppo", "matrix", "cpu")
    options = k8s.K8sOptions(image="reg/rb/ppo:all", parallelism=2, namespace="ml")
    objects = k8s.manifest(cells, options)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Job"]
    job = objects[1]
    assert job["metadata"]["namespace"] == "ml"
    assert job["spec"]["completions"] == 4 and job["spec"]["parallelism"] == 2
    assert "resources" not in job["spec"]["template"]["spec"]["containers"][0]  # cpu: no GPUs
    assert [c["index"] for c in _cells_of(objects)] == [0, 1, 2, 3]


def test_no_cells_and_unknown_platform_are_bad_input(ppo_root: Path) -> None:
    with pytest.raises(BadInput, match="no cells"):
        k8s.manifest([])
    with pytest.raises(BadInput, match="no platform 'tpu'"):
        jobs.job_cells(ppo_root, "ppo", "all", "tpu")


FAKE_SCRIPT = """\
import json, os, sys
verdict = sys.argv[sys.argv.index("--variant") + 1]
kl = 0.1 if verdict == "broken" else 0.0
result = {"schema": 1, "variant": verdict, "verdict": "reproduced" if kl else "clean",
          "metrics": {"max_abs_kl_step0": kl}, "series": {"kl_rank0": [kl, kl]},
          "versions": {"trl": "0.7.1"}, "wall_time_s": 1.5}
print("step 0 kl", kl)
with open(os.environ["REPRO_RESULT"], "w") as f:
    json.dump(result, f)
sys.exit(1 if kl else 0)
"""


def _run_pod(cell: dict, index: int, cells_dir: Path, out: Path) -> int:
    """The pod's script, with the mounts pointed at temporary folders."""
    script = k8s.POD_SCRIPT.replace(k8s.CELLS_MOUNT, str(cells_dir)).replace(
        f'"{k8s.OUT_MOUNT}"', json.dumps(str(out))
    )
    env = {"JOB_COMPLETION_INDEX": str(index), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
    return done.returncode


def test_pod_script_then_collect(ppo_root: Path, tmp_path: Path) -> None:
    cells = [c.to_json() for c in jobs.job_cells(ppo_root, "ppo", "default", "cpu")]
    fake = tmp_path / "fake_ppo.py"
    fake.write_text(FAKE_SCRIPT)
    for cell in cells:
        cell["launch"] = [sys.executable, str(fake)]
    cells_dir, out = tmp_path / "cells", tmp_path / "out"
    cells_dir.mkdir()
    (cells_dir / "cells.json").write_text(json.dumps(cells))
    # a verdict, reproduced or clean, is a successful pod
    assert [_run_pod(c, i, cells_dir, out) for i, c in enumerate(cells)] == [0, 0]
    assert (out / "0" / "exit_code").read_text() == "1\n"
    assert "step 0 kl 0.1" in (out / "0" / "launch.log").read_text()
    # a crash fails the pod, so Kubernetes retries that index
    cells[1]["launch"] = [sys.executable, "-c", "import sys; sys.exit(3)"]
    (cells_dir / "cells.json").write_text(json.dumps(cells))
    assert _run_pod(cells[1], 1, cells_dir, tmp_path / "out_crash") == 3

    found = collect(out, ppo_root, RecordStore(results_dir(ppo_root)))
    by_label = {r.label: r for r in found.records}
    assert set(by_label) == {"broken", "fixed"} and found.skipped == []
    assert by_label["broken"].verdict == "reproduced" and by_label["broken"].status == "match"
    assert by_label["fixed"].verdict == "clean" and by_label["fixed"].status == "match"
    assert by_label["broken"].result["series"]["kl_rank0"] == [0.1, 0.1]
    for record in found.records:
        saved = Path(record.dir)
        assert saved.parent.parent == results_dir(ppo_root) / "ppo"
        assert Record.load(saved / RECORD_FILE).label == record.label
        assert (saved / "launch.log").is_file()
    assert (out / "0" / "result.json").is_file()  # the source is left as it was


def test_collect_half_written_result_becomes_an_error_record(
    ppo_root: Path, tmp_path: Path
) -> None:
    cell = jobs.job_cells(ppo_root, "ppo", "default", "cpu")[0].to_json()
    folder = tmp_path / "out" / "0"
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps(cell))
    (folder / "result.json").write_text('{"schema": 1, "verd')
    (folder / "exit_code").write_text("137\n")
    stray = tmp_path / "out" / "1"
    stray.mkdir()
    (stray / "cell.json").write_text(json.dumps({**cell, "repro": "nope"}))
    found = collect(tmp_path / "out", ppo_root, RecordStore(results_dir(ppo_root)))
    assert len(found.records) == 1
    record = found.records[0]
    assert record.status == "error" and record.verdict is None
    assert "half-written" in record.reason and "pod exit 137" in record.reason
    assert len(found.skipped) == 1 and "unknown repro 'nope'" in found.skipped[0]


def test_collect_copied_results_and_refuse_overlap(ppo_root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "other-machine"
    record = save_record(ppo_root, "broken", "reproduced", kl=0.2)
    source = elsewhere / "ppo" / "broken" / Path(record.dir).name
    source.parent.mkdir(parents=True)
    Path(record.dir).rename(source)
    found = collect(elsewhere, ppo_root, RecordStore(results_dir(ppo_root)))
    assert [r.label for r in found.records] == ["broken"]
    assert Path(found.records[0].dir).parent == results_dir(ppo_root) / "ppo" / "cpu-broken"
    assert (source / RECORD_FILE).is_file()
    with pytest.raises(BadInput, match="overlaps"):
        collect(results_dir(ppo_root), ppo_root, RecordStore(results_dir(ppo_root)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInput, match="no cell outputs"):
        collect(empty, ppo_root, RecordStore(results_dir(ppo_root)))


def _listing(root: Path) -> list[dict]:
    cells = [
        {"repro": "ppo", "variant": "default", "trl": None},
        {"repro": "ppo", "variant": "broken", "trl": "0.7.1"},
        {"repro": "ppo", "variant": "fixed", "trl": "0.7.2"},
    ]
    return [
        {
            "session": f"repro_ppo({'default' if c['variant'] == 'default' else c['variant']})",
            "name": "repro_ppo",
            "tags": ["default"],
            "call_spec": c,
        }
        for c in cells
    ]


def test_github_matrix_splits_cpu_and_gpu(ppo_root: Path) -> None:
    found = jobs.github_matrix(ppo_root, _listing(ppo_root))
    assert len(found["cpu"]["include"]) == 3 and found["gpu"]["include"] == []  # no image yet
    image = ppo_root / "images" / "ppo"
    image.mkdir(parents=True)
    (image / "Dockerfile").write_text("FROM scratch\n")
    found = jobs.github_matrix(ppo_root, _listing(ppo_root))
    assert found["gpu"]["include"] == [
        {"repro": "ppo", "variant": "broken", "args": "--variant broken", "gpus": 2},
        {"repro": "ppo", "variant": "fixed", "args": "--variant fixed", "gpus": 2},
        {
            "repro": "ppo",
            "variant": "broken",
            "args": "--variant broken --with=trl==0.7.1",
            "gpus": 2,
        },
        {
            "repro": "ppo",
            "variant": "fixed",
            "args": "--variant fixed --with=trl==0.7.2",
            "gpus": 2,
        },
    ]
    assert found["repros"] == ["ppo"]
    with pytest.raises(BadInput, match="not a reprobox session"):
        jobs.github_matrix(ppo_root, [{"session": "lint", "call_spec": {}}])


def test_canary_plan(ppo_root: Path) -> None:
    assert jobs.canary_plan(ppo_root) == [{"repro": "ppo", "package": "trl"}]


# ---- the commands


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reprobox")
    scaleout_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_k8s_command_writes_once(ppo_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "job.yaml"
    args = _parse("k8s", "ppo", "--image-prefix", "reg/rb", "--out", str(out), "--cells", "default")
    assert args.handler(args) == 0
    assert len(_cells_of(_objects(out.read_text()))) == 2
    with pytest.raises(BadInput, match="exists"):
        args.handler(args)


def test_ci_matrix_command(ppo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    listing = tmp_path / "sessions.json"
    listing.write_text(json.dumps(_listing(ppo_root)))
    args = _parse("ci-matrix", str(listing))
    assert args.handler(args) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == {"cpu", "gpu", "repros"}
    assert len(json.loads(lines["cpu"])["include"]) == 3
    listing.write_text("not json")
    with pytest.raises(BadInput, match="not the JSON of `nox --json -l`"):
        args.handler(args)


class _FakeIndex:
    @classmethod
    def from_settings(cls, settings: object) -> _FakeIndex:
        return cls()

    def releases(self, package: str) -> list[Release]:
        return [
            Release(Version("0.7.1")),
            Release(Version("0.9.0"), yanked=True),
            Release(Version("0.8.0")),
            Release(Version("0.10.0rc1")),
        ]


def test_newest_release(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(scaleout_cli, "SimpleIndex", _FakeIndex)
    args = _parse("newest", "trl")
    assert args.handler(args) == 0
    assert capsys.readouterr().out == "0.8.0\n"
    args = _parse("newest", "trl", "--pre")
    assert args.handler(args) == 0
    assert capsys.readouterr().out == "0.10.0rc1\n"
