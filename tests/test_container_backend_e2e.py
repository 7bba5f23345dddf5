"""`--backend container` for real: `reprobox run` and a release bisect whose cells run in the
image built from each cell's own lock, with podman (or docker), on the local base image.

The repro ("gate") needs no torch: its one package, reprobox-gatepkg, is six real releases
built here (GATE on from 1.3.0), listed by a PEP 691 index on 127.0.0.1 (what uv locks
against) and handed to each image build from a find-links folder (what the image installs).
A script that dies after writing a clean result, and the harness killed by Ctrl-C or SIGTERM
mid-run, show the faults: an error and never a verdict, and no container left behind.

Needs a container engine and the local base image, as tests/test_images_e2e.py does; set
REPROBOX_SKIP_CONTAINERS=1 to leave these tests out knowingly. REPROBOX_ENGINE=docker runs
the whole module under docker (the CLI reads the same setting); REPROBOX_TEST_ENGINES="podman
docker" has the last test compare the two.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version
from wheel_index import WheelIndex, write_wheel

from conftest import ROOT, newest_records, reprobox
from reprobox.core import spec
from reprobox.core.errors import ExitCode
from reprobox.run.backends import container as images

pytestmark = [pytest.mark.e2e, pytest.mark.container]
BASE = os.environ.get("REPROBOX_BASE_IMAGE", "localhost/reprobox-base:bookworm-py3.11")
PACKAGE = "reprobox-gatepkg"
VERSIONS = ["1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0"]  # GATE on from 1.3.0

TOML = f"""\
[repro]
title = "reproduces once gatepkg.GATE is on"
upstream = "https://example.invalid/gate"
script = "gate.py"

[launch]
launcher = "python"
processes = 1
timeout = 120

[env]
python = "3.11"
pins = ["{PACKAGE}==1.5.0"]

[verdict]
reproduced_if = [{{ metric = "gate", above = 0.5 }}]

[variants.broken]
expect = "reproduced"
args = ["--mode", "gate"]

[variants.control]
expect = "clean"
args = ["--mode", "control"]

[variants.probe]
expect = "unknown"
args = ["--mode", "gate"]
default = false

[variants.dies]
expect = "clean"
args = ["--mode", "dies"]
default = false

[variants.sleeps]
expect = "clean"
args = ["--mode", "sleeps"]
default = false
"""

SCRIPT = """\
import argparse, json, os, time
import gatepkg
mode = argparse.ArgumentParser()
mode.add_argument("--mode")
mode.add_argument("--variant")
args, _ = mode.parse_known_args()
hit = gatepkg.GATE and args.mode == "gate"
verdict = "reproduced" if hit else "clean"
result = {"schema": 1, "variant": args.variant, "verdict": verdict,
          "metrics": {"gate": 1.0 if hit else 0.0}, "reason": f"gatepkg {gatepkg.VERSION}"}
if args.mode == "sleeps":
    time.sleep(600)
with open(os.environ["REPRO_RESULT"], "w") as handle:
    json.dump(result, handle)
if args.mode == "dies":  # a clean result on disk, then it waits to be killed (the test)
    time.sleep(600)
raise SystemExit(1 if hit else 0)
"""


@pytest.fixture(scope="module")
def engine() -> images.Engine:
    try:
        found = images.find_engine(os.environ.get("REPROBOX_ENGINE") or None)
    except Exception as exc:
        if os.environ.get("REPROBOX_SKIP_CONTAINERS") == "1":
            pytest.skip(f"REPROBOX_SKIP_CONTAINERS=1: {exc}")
        pytest.fail(f"{exc} (or set REPROBOX_SKIP_CONTAINERS=1 to leave container tests out)")
    if BASE.startswith("localhost/") and not found.image_exists(BASE):
        if found.name == "podman":
            build = ["bash", str(ROOT / "images" / "base" / "build-base.sh"), BASE]
            subprocess.run(build, check=True)
        else:
            _base_in(found)
    return found


@pytest.fixture(scope="module")
def gate_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the index URL, the wheels folder): every release as a real wheel."""
    out = tmp_path_factory.mktemp("gate-wheels")
    for version in VERSIONS:
        gate = Version(version) >= Version("1.3.0")
        init = f"GATE = {gate}\nVERSION = {version!r}\n"
        write_wheel(out, PACKAGE, version, {"gatepkg/__init__.py": init})
    with WheelIndex([out]) as index:
        yield index.url, out


@pytest.fixture
def gate_root(
    scratch_root: Path,
    gate_index: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A checkout holding the gate repro and its image recipe."""
    from reprobox.run.dockerfile import render

    url, wheels = gate_index
    directory = scratch_root / "repros" / "gate"
    directory.mkdir()
    (directory / "repro.toml").write_text(TOML)
    (directory / "gate.py").write_text(SCRIPT)
    (scratch_root / "images" / "gate").mkdir(parents=True)
    (scratch_root / "images" / "install-lock.sh").write_text(
        (ROOT / "images" / "install-lock.sh").read_text()
    )
    (scratch_root / "images" / "gate" / "Dockerfile").write_text(
        render(spec.load(scratch_root, "gate"))
    )
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_INDEX_URL", url)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("REPROBOX_FIND_LINKS", str(wheels))  # what the image builds install
    monkeypatch.setenv("REPROBOX_BASE_IMAGE", BASE)
    ca = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT")
    if ca and Path(ca).is_file():  # TLS-intercepting proxies: uv in the build asks PyPI too
        monkeypatch.setenv("REPROBOX_CA_BUNDLE", ca)
    return scratch_root


def containers(engine: images.Engine, settle_s: float = 15.0) -> list[str]:
    """The harness's containers still listed once the engine's own clean-up has had
    `settle_s` to finish: what is left then was left behind."""
    deadline = time.monotonic() + settle_s
    while True:
        listed = subprocess.run([engine.name, "ps", "-a", "--format", "{{.Names}}"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        names = [n for n in listed.stdout.split() if n.startswith("reprobox-")]
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


_NAME = re.compile(r"--name (reprobox-[0-9a-f]+)")


def _image_id(engine: images.Engine, tag: str) -> str:
    done = subprocess.run([engine.name, "image", "inspect", "--format", "{{.Id}}", tag],
                          capture_output=True, text=True, check=True)  # fmt: skip
    found = done.stdout.strip()
    return found if found.startswith("sha256:") else f"sha256:{found}"


def test_run_in_containers_gives_the_venv_verdicts_and_names_each_image(
    engine: images.Engine, gate_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_venv = reprobox("run", "gate")
    assert in_venv.returncode == 0, in_venv.stderr
    venv = newest_records(gate_root / "results", "gate")
    monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / "boxed"))
    started = time.monotonic()
    boxed = reprobox("run", "gate", "--backend", "container", timeout=1800)
    first_s = time.monotonic() - started
    assert boxed.returncode == 0, boxed.stderr
    box = newest_records(tmp_path / "boxed", "gate")
    for label in ("broken", "control"):
        assert box[label]["verdict"] == venv[label]["verdict"]
        assert box[label]["result"]["reason"] == venv[label]["result"]["reason"]
        assert box[label]["runner"].startswith(f"{engine.name} localhost/reprobox/gate:")
        tag = box[label]["runner"].split()[-1]
        assert box[label]["image"] == _image_id(engine, tag)  # the record names the digest
        # each variant's own image, though both share one lock: its label and its command
        shown = subprocess.run(
            [engine.name, "image", "inspect", "--format",
             '{{index .Config.Labels "org.reprobox.variant"}} {{.Config.Env}}', tag],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert shown.startswith(f"{label} ") and f"--variant {label}" in shown, shown
        assert venv[label]["image"] == "" and "image" not in venv[label]["machine"]
        # the machine under the launch: the container's /dev/shm, not the host's
        assert box[label]["machine"]["image"] == box[label]["image"]
        assert box[label]["machine"]["dev_shm"] == "1.0 GiB"
        assert box[label]["machine"]["kernel"] == venv[label]["machine"]["kernel"]
    assert box["broken"]["verdict"] == "reproduced" and box["control"]["verdict"] == "clean"
    assert box["broken"]["image"] != box["control"]["image"]
    assert containers(engine) == []
    # `verdict` (git bisect run's exit codes) in the same image: 1, reproduced
    said = reprobox("verdict", "gate", "--variant", "broken", "--backend", "container")
    assert said.returncode == ExitCode.FAILED, said.stderr

    # the same locks, Dockerfile and repro files: the same images, not built again
    started = time.monotonic()
    again = reprobox("run", "gate", "--backend", "container", timeout=1800)
    print(f"first run {first_s:.1f}s, again {time.monotonic() - started:.1f}s")
    assert again.returncode == 0, again.stderr
    assert [r["image"] for r in newest_records(tmp_path / "boxed", "gate").values()] == [
        r["image"] for r in box.values()
    ]
    # a repro file changes: a new tag, a new image
    (gate_root / "repros" / "gate" / "NOTES.txt").write_text("changed\n")
    changed = reprobox("run", "gate", "--variant", "control", "--backend", "container")
    assert changed.returncode == 0, changed.stderr
    record = newest_records(tmp_path / "boxed", "gate")["control"]
    assert record["runner"] != box["control"]["runner"]
    assert record["image"] != box["control"]["image"]


def test_a_release_bisect_in_containers_with_two_workers(
    engine: images.Engine, gate_root: Path
) -> None:
    args = ["bisect", "gate", "--package", PACKAGE, "--good", "1.0.0", "--bad", "1.5.0",
            "--variant", "probe", "--workers", "2"]  # fmt: skip
    took = {}
    for kind in ("venv", "container"):
        started = time.monotonic()
        done = reprobox(*args, "--backend", kind, "--log", str(gate_root / f"{kind}.jsonl"),
                        timeout=2400)  # fmt: skip
        took[kind] = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        last = done.stdout.strip().splitlines()[-1]
        print(f"--backend {kind}: {last} ({took[kind]:.0f}s)")
        assert last.startswith(f"first reproducing release: {PACKAGE} 1.3.0 (assuming one change")
    line = next(x for x in done.stderr.splitlines() if "summary: " in x)
    summary = json.loads(Path(line.split("summary: ")[1].strip()).read_text())
    by_release: dict[str, set[str]] = {}
    for probe in summary["probes"]:
        record = json.loads((Path(probe["record"]) / "record.json").read_text())
        assert record["runner"].startswith(engine.name) and record["image"].startswith("sha256:")
        by_release.setdefault(record["result"]["reason"], set()).add(record["image"])
    assert all(len(found) == 1 for found in by_release.values())  # one image per release
    assert len({i for found in by_release.values() for i in found}) == len(by_release) >= 3
    assert containers(engine) == []
    # a sweep maps every release in containers, its images already built by the bisect
    swept = reprobox("sweep", "gate", "--package", PACKAGE, "--range", "1.0.0..1.5.0",
                     "--variant", "probe", "--backend", "container", "--workers", "2")  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    swept_last = swept.stdout.strip().splitlines()[-1]
    print(f"sweep --backend container: {swept_last}")
    assert swept_last.startswith(f"{PACKAGE} affected: >=1.3.0,<=1.5.0 (6 of 6 releases tested")


def test_a_container_that_dies_is_an_error_never_a_verdict(
    engine: images.Engine, gate_root: Path
) -> None:
    """The script writes a clean result, then its container is killed from outside (as the
    kernel's OOM killer or `podman kill` would): the run is an error, never "clean"."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "gate", "--variant", "dies", "--backend",
         "container"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 900
    name = None
    while time.monotonic() < deadline and proc.poll() is None and name is None:
        for result in (gate_root / "results" / "gate").glob("*/*/result.json"):
            found = _NAME.findall((result.parent / "launch.log").read_text())
            name = found[0] if found else None
        time.sleep(0.3)
    assert name is not None, f"no result written (harness exit {proc.poll()})"
    subprocess.run([engine.name, "kill", name], check=True, capture_output=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode not in (ExitCode.OK, ExitCode.FAILED, ExitCode.CANNOT_TEST), err
    [record] = newest_records(gate_root / "results", "gate").values()
    assert record["status"] == "error" and record["verdict"] is None, record
    assert json.loads((Path(record["dir"]) / "result.json").read_text())["verdict"] == "clean"
    print(f"exit {proc.returncode}: {err.strip().splitlines()[-1]}")
    assert containers(engine) == []


@pytest.mark.parametrize(
    ("sig", "code", "workers"), [(signal.SIGINT, 130, "2"), (signal.SIGTERM, 143, "1")]
)
def test_an_interrupted_harness_leaves_no_container(
    engine: images.Engine, gate_root: Path, sig: signal.Signals, code: int, workers: str
) -> None:
    """Ctrl-C with two launches at once (the concurrent path: cancel_all), SIGTERM with one
    (the launch's own clean-up); kill -9 is tests/test_container_watchdog.py's."""
    before = set(containers(engine, settle_s=0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprobox", "run", "gate", "--variant", "broken", "--variant",
         "sleeps", "--backend", "container", "--workers", workers],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 900
    running: set[str] = set()
    while time.monotonic() < deadline and proc.poll() is None and not running:
        logs = (gate_root / "results" / "gate").glob("*sleeps*/*/launch.log")
        logs = [*logs, *(gate_root / "results" / "gate").glob("*/*sleeps*/launch.log")]
        named = {m for log in logs for m in _NAME.findall(log.read_text())}
        running = named & set(containers(engine, settle_s=0))
        time.sleep(0.3)
    assert running, f"no container started (harness exit {proc.poll()})"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert set(containers(engine)) - before == set()
    records = newest_records(gate_root / "results", "gate")
    assert records["sleeps"]["verdict"] is None and records["sleeps"]["exit_code"] == code


def test_a_missing_engine_is_one_line(gate_root: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("git",):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if found:
            (bare / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bare)}
    env.pop("REPROBOX_ENGINE", None)  # no engine named: it looks for either
    done = subprocess.run([sys.executable, "-m", "reprobox", "run", "gate", "--backend",
                           "container"], capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == ExitCode.NO_ENGINE, done.stderr
    assert done.stderr.strip().splitlines() == [
        "reprobox: error: no container engine found (podman or docker); on Debian: "
        "sudo bash images/setup-podman.sh"
    ]
    assert list(gate_root.rglob("record.json")) == []


def test_images_are_pruned_to_the_disk_bound_oldest_first(
    engine: images.Engine, tmp_path: Path
) -> None:
    """Three labelled images of a prefix of this test's own; a bound that holds two keeps
    the newest two; one in `keep` stays whatever its age."""
    prefix = f"localhost/reprobox-prune-{os.getpid()}/"
    tags = []
    for n in range(3):
        context = tmp_path / f"c{n}"
        context.mkdir()
        (context / "Containerfile").write_text(
            f"FROM {BASE}\nLABEL {images.LOCK_LABEL}={n}\nRUN echo {n} > /n\n"
        )
        tag = f"{prefix}img:{n}"
        pull = ["--pull=never"] if engine.name == "podman" else []
        subprocess.run([engine.name, "build", *pull, "-f", str(context / "Containerfile"), "-t",
                        tag, str(context)],
                       check=True, capture_output=True, timeout=300)  # fmt: skip
        tags.append(tag)
        time.sleep(1.1)  # created a second apart: oldest first is well defined
    try:
        found = images.stored(engine, prefix)
        assert [s.tags[0] for s in found] == tags
        size = max(s.size for s in found)
        removed = images.prune(engine, 2 * size + size // 2, keep=set(), prefix=prefix)
        assert removed == [tags[0]]
        removed = images.prune(engine, size // 2, keep={tags[1]}, prefix=prefix)
        assert removed == [tags[2]]
        assert [s.tags[0] for s in images.stored(engine, prefix)] == [tags[1]]
    finally:
        subprocess.run([engine.name, "rmi", "-f", *tags], capture_output=True, timeout=120)


ENGINES = os.environ.get("REPROBOX_TEST_ENGINES", "podman").split()


def _base_in(engine: images.Engine) -> None:
    """The local base image in `engine`, copied from the other engine where it was built."""
    if not BASE.startswith("localhost/") or engine.image_exists(BASE):
        return
    other = "podman" if engine.name == "docker" else "docker"
    saved = subprocess.run([other, "save", BASE], capture_output=True, check=True).stdout
    subprocess.run([engine.name, "load"], input=saved, capture_output=True, check=True)


def test_the_same_run_under_each_engine(
    gate_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """podman and docker (REPROBOX_TEST_ENGINES, default podman: docker's daemon is not
    everywhere) give the same verdicts and results; each leaves no container."""
    seen = {}
    for name in ENGINES:
        engine = images.find_engine(name)  # an engine named here must work: no skip
        _base_in(engine)
        monkeypatch.setenv("REPROBOX_RESULTS", str(tmp_path / name))
        started = time.monotonic()
        done = reprobox("run", "gate", "--backend", "container", "--engine", name, timeout=1800)
        assert done.returncode == 0, done.stderr
        print(f"{name}: {time.monotonic() - started:.1f}s")
        records = newest_records(tmp_path / name, "gate")
        assert all(r["runner"].startswith(f"{name} ") for r in records.values())
        assert all(r["image"].startswith("sha256:") for r in records.values())
        seen[name] = {label: (r["verdict"], r["result"]["reason"]) for label, r in records.items()}
        assert containers(engine) == []
    assert seen[ENGINES[0]] == {"broken": ("reproduced", "gatepkg 1.5.0"),
                                "control": ("clean", "gatepkg 1.5.0")}  # fmt: skip
    assert all(found == seen[ENGINES[0]] for found in seen.values()), seen
