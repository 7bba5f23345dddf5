"""A noisy bisect through the CLI, for real: `reprobox bisect --flaky` over six real releases
of a tiny package (real wheels, served with their release list as a PEP 691 index on
127.0.0.1, which uv installs from), each probe a real environment and a real run of a
one-process repro that reproduces in ~70% of runs from 1.3.0 on (its randomness seeded by a
counter file beside the script, so the test is the same every time). It names 1.3.0 with its
posterior and runs, re-probing into new run folders; killed with SIGKILL mid-way and run
again, it resumes from the probe log without re-running a finished probe."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import reprobox
from reprobox.bisect.summary import BisectSummary, read_summary
from reprobox.envs.uv import uv_bin

# its module-scoped fixture is built once: all of it on one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tests/test_bisect_flaky_e2e.py")]

PACKAGE = "reprobox-noisypkg"
VERSIONS = ["1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0"]  # GATE on from 1.3.0
JSON_TYPE = "application/vnd.pypi.simple.v1+json"

TOML = f"""\
[repro]
title = "reproduces in about 70% of runs once noisypkg.GATE is on"
upstream = "https://example.invalid/noisy"
script = "noisy.py"

[launch]
launcher = "python"
processes = 1
timeout = 60

[env]
python = "3.11"
pins = ["{PACKAGE}==1.0.0"]

[verdict]
reproduced_if = [{{ metric = "hit", above = 0.5 }}]

[variants.broken]
expect = "unknown"
"""

SCRIPT = """\
import fcntl, json, os, random, sys
from pathlib import Path
import noisypkg
counter = Path(__file__).with_name("runs.count")  # the n-th run of this repro, any release
with open(counter, "a+") as held:  # --workers 2 runs two at once: one reader at a time
    fcntl.flock(held, fcntl.LOCK_EX)
    held.seek(0)
    n = int(held.read() or 0)
    held.seek(0)
    held.truncate()
    held.write(str(n + 1))
hit = noisypkg.GATE and random.Random(f"{noisypkg.VERSION}-{n}").random() < 0.7
verdict = "reproduced" if hit else "clean"
result = {"schema": 1, "variant": "broken", "verdict": verdict,
          "metrics": {"hit": 1.0 if hit else 0.0}, "reason": f"run {n} of {noisypkg.VERSION}"}
with open(os.environ["REPRO_RESULT"], "w") as handle:
    json.dump(result, handle)
sys.exit({"clean": 0, "reproduced": 1}[verdict])
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"

[tool.setuptools]
packages = ["noisypkg"]
"""


@pytest.fixture(scope="module")
def noisy_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Every release as a real wheel, on a PEP 691 JSON index served on 127.0.0.1: the
    release list the bisect reads and the files uv installs come from the same place."""
    out = tmp_path_factory.mktemp("noisy-wheels")
    for version in VERSIONS:
        source = tmp_path_factory.mktemp(f"noisy-{version}")
        (source / "pyproject.toml").write_text(PYPROJECT.format(name=PACKAGE, version=version))
        (source / "noisypkg").mkdir()
        gate = Version(version) >= Version("1.3.0")
        (source / "noisypkg" / "__init__.py").write_text(f"GATE = {gate}\nVERSION = {version!r}\n")
        subprocess.run(
            [uv_bin(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(source)],
            check=True,
        )
    wheels = {w.name: w for w in sorted(out.glob("*.whl"))}
    page = json.dumps({
        "meta": {"api-version": "1.0"},
        "name": PACKAGE,
        "files": [
            {"filename": name, "url": f"/files/{name}",
             "hashes": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}
            for name, path in wheels.items()
        ],
    }).encode()  # fmt: skip

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # uv asks for a wheel's size before fetching it
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, *, head: bool) -> None:
            path = self.path.split("?")[0]
            if path.rstrip("/") == f"/simple/{PACKAGE}":
                body, kind = page, JSON_TYPE
            elif path.startswith("/files/") and path[7:] in wheels:
                body, kind = wheels[path[7:]].read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def noisy_root(
    scratch_root: Path,
    noisy_index: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    directory = scratch_root / "repros" / "noisy"
    directory.mkdir()
    (directory / "repro.toml").write_text(TOML)
    (directory / "noisy.py").write_text(SCRIPT)
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))  # its own release list
    monkeypatch.setenv("UV_INDEX_URL", noisy_index)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    return scratch_root


ARGS = ["bisect", "noisy", "--package", PACKAGE, "--good", "1.0.0", "--bad", "1.5.0"]
ARGS += ["--variant", "broken", "--flaky"]


def _summary(err: str) -> BisectSummary:
    line = next(x for x in err.splitlines() if "summary: " in x)
    return read_summary(Path(line.split("summary: ")[1].strip()))


def test_a_noisy_bisect_names_the_release_with_its_confidence(noisy_root: Path) -> None:
    started = time.monotonic()
    done = reprobox(*ARGS)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    print(f"{last}\n({took:.0f}s)")  # shown with -s: the answer, its runs and its time
    assert last.startswith(f"first reproducing release: {PACKAGE} 1.3.0 (posterior ")
    assert " runs; reproduces in " in last and " before; assuming at most one change " in last
    summary = _summary(done.stderr)
    assert summary.status == "found" and summary.strategy == "flaky"
    assert summary.runs > summary.distinct_probed  # it re-probed where it was unsure
    folders = [p.record for p in summary.probes if p.fresh]
    assert len(folders) == summary.runs and len(set(folders)) == len(folders)
    for folder in folders:  # every re-probe is a run of its own, judged from its result
        record = json.loads((Path(str(folder)) / "record.json").read_text())
        assert record["verdict"] in ("clean", "reproduced")
    assert summary.outcomes["1.2.0"][0] == 0 < summary.outcomes["1.3.0"][0]


def test_a_noisy_bisect_killed_with_sigkill_resumes_from_its_log(noisy_root: Path) -> None:
    log = noisy_root / "noisy.jsonl"
    args = [sys.executable, "-m", "reprobox", *ARGS, "--log", str(log)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= 5:  # header + 4 probes
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the bisect ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(log.read_text().splitlines()) - 1
    done = reprobox(*ARGS, "--log", str(log))
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"first reproducing release: {PACKAGE} 1.3.0 (posterior ")
    summary = _summary(done.stderr)
    assert sum(1 for p in summary.probes if p.resumed) >= finished >= 4
    keys = [p.key for p in summary.probes]
    assert len(keys) == len(set(keys))  # no probe measured twice


def test_a_noisy_bisect_with_two_workers_names_the_same_release(noisy_root: Path) -> None:
    done = reprobox(*ARGS, "--workers", "2")
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    print(f"\n{last}")
    assert last.startswith(f"first reproducing release: {PACKAGE} 1.3.0 (posterior ")
    summary = _summary(done.stderr)
    assert summary.runs > summary.distinct_probed and summary.strategy == "flaky"


DECLARED_TOML = TOML.replace(
    'reproduced_if = [{ metric = "hit", above = 0.5 }]',
    'reproduced_if = [{ metric = "hit", above = 0.5 }]\nrepeats = 20\ntest = "sprt"\nseed = 7',
).replace('script = "noisy.py"', 'script = "declared.py"')
# Declared noisy: its randomness is the launch's REPRO_SEED (one seed a launch, as the harness
# gives them), not a counter; each probe's seed is [verdict] seed plus its attempt's index.
DECLARED_SCRIPT = SCRIPT.replace(
    'random.Random(f"{noisypkg.VERSION}-{n}")',
    "random.Random(f\"{noisypkg.VERSION}-{os.environ['REPRO_SEED']}\")",
)


def test_a_declared_noisy_variant_is_bisected_one_launch_a_probe(noisy_root: Path) -> None:
    """A variant that declares `[verdict] repeats` is bisected flake-aware by default, and
    every probe is ONE launch, an observation for the posterior: not a repeated verdict
    (up to 20 launches a probe, and undecided would stop the bisect)."""
    directory = noisy_root / "repros" / "declared"
    directory.mkdir()
    (directory / "repro.toml").write_text(DECLARED_TOML)
    (directory / "declared.py").write_text(DECLARED_SCRIPT)
    args = ["bisect", "declared", "--package", PACKAGE, "--good", "1.0.0", "--bad", "1.5.0"]
    done = reprobox(*args, "--variant", "broken")  # no --flaky: the declaration turns it on
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"first reproducing release: {PACKAGE} 1.3.0 (posterior "), last
    summary = _summary(done.stderr)
    assert summary.strategy == "flaky" and summary.runs > summary.distinct_probed
    seeds = set()
    for probe in summary.probes:
        record = json.loads((Path(str(probe.record)) / "record.json").read_text())
        assert record["verdict"] in ("clean", "reproduced")
        assert len(record["samples"]) == 1, record["samples"]  # one launch a probe
        [sample] = record["samples"]
        assert sample["repeat"] == probe.attempt - 1 and sample["seed"] == 7 + probe.attempt - 1
        seeds.add((probe.item, sample["seed"]))
    assert len(seeds) == summary.runs  # a re-probe is a new launch with a new seed


def test_a_plain_bisect_of_an_undeclared_noisy_history_says_flaky(noisy_root: Path) -> None:
    """Without --flaky (the repro declares no noise) the bisect trusts each probe, so noise
    can steer it to a wrong boundary; its confirmation probes (the boundary pair re-run,
    --confirm, default 2) disagree, and it says so with exit 1, never a wrong answer with 0."""
    plain = [a for a in ARGS if a != "--flaky"]
    done = reprobox(*plain)
    last = done.stdout.strip().splitlines()[-1]
    print(f"\n{last}")
    summary = _summary(done.stderr)
    if done.returncode == 0:  # an answer: it must be the right one
        assert summary.status == "found" and summary.first == "1.3.0", last
    else:
        assert done.returncode == 1 and summary.status in ("flaky", "non-monotone"), last
        assert "rerun with --flaky" in last, last
