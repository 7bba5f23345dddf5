"""kill -9 of the harness during a container run (issue 11, items 1 and 3): its watchdog
removes the container, which `podman run` would otherwise leave running for ever.

A real engine and a real container: a tiny image on the local base (a python that sleeps),
started by `ContainerBackend.launch` in a harness process that the test then SIGKILLs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fakes import repro_toml, write_repro
from reprobox.run.backends import container as images

pytestmark = [pytest.mark.e2e, pytest.mark.container, pytest.mark.slow]
BASE = os.environ.get("REPROBOX_BASE_IMAGE", "localhost/reprobox-base:bookworm-py3.11")

SLEEPER = repro_toml(
    title="a container run that never ends",
    upstream="https://example.invalid/sleeper",
    script="sleeper.py",
    timeout=600,
    python=None,
    pins=["six==1.16.0"],
    variants={"hang": "clean"},
)

HARNESS = """\
import sys
from pathlib import Path
from reprobox.core import spec
from reprobox.core.cells import make_cell, script_args
from reprobox.core.settings import Settings
from reprobox.run.backend import Case, LaunchRequest, Prepared
from reprobox.run.backends.container import ContainerBackend, Engine, ImageSpec

settings = Settings.from_env()
repro = spec.load(settings.root, "sleeper")
cell = make_cell(repro, "hang")
run_dir = Path(sys.argv[3])
run_dir.mkdir(parents=True)
lock = repro.dir / "sleeper.py"  # not read by launch
image = ImageSpec(repro, "hang", "cpu", lock, lock, sys.argv[2])
prepared = Prepared(key=sys.argv[2], lock=lock, lock_hash="-", runner="podman", env_s=0.0,
                    handle=image)
case = Case(cell, tuple(script_args(repro, cell)), run_dir)
request = LaunchRequest(repro, repro.launch("hang"), (case,), 600.0)
ContainerBackend(settings, Engine(sys.argv[1])).launch(prepared, request)
"""


@pytest.fixture(scope="module")
def sleeper_image(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[images.Engine, str]]:
    """A tiny image on the local base: /opt/venv/bin/python, and nothing else."""
    engine = images.find_engine(os.environ.get("REPROBOX_ENGINE") or None)
    if not engine.image_exists(BASE):
        pytest.fail(f"base image {BASE} is missing: build it with images/base/build-base.sh")
    context = tmp_path_factory.mktemp("sleeper-image")
    (context / "Containerfile").write_text(
        f'FROM {BASE}\nRUN mkdir -p /opt/venv/bin && ln -s "$(command -v python3)" '
        "/opt/venv/bin/python && mkdir -p /opt/repro /out\n"
        "RUN printf 'import time\\nwhile True:\\n    time.sleep(1)\\n' > /opt/repro/sleeper.py\n"
    )
    tag = f"localhost/reprobox-test/sleeper:{uuid.uuid4().hex[:8]}"
    pull = ["--pull=never"] if engine.name == "podman" else []
    subprocess.run([engine.name, "build", *pull, "-f", str(context / "Containerfile"), "-t", tag,
                    str(context)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    yield engine, tag
    subprocess.run([engine.name, "rmi", "-f", tag], capture_output=True, timeout=120)


def _exists(engine: images.Engine, name: str) -> bool:
    args = ["container", "exists", name] if engine.name == "podman" else ["inspect", name]
    return subprocess.run([engine.name, *args], capture_output=True).returncode == 0


def test_kill_9_of_the_harness_removes_its_container(
    sleeper_image: tuple[images.Engine, str], scratch_root: Path, tmp_path: Path
) -> None:
    engine, tag = sleeper_image
    write_repro(scratch_root, "sleeper", SLEEPER, script="sleeper.py")
    run_dir = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HARNESS), engine.name, tag, str(run_dir)],
        start_new_session=True,
    )
    log = run_dir / "launch.log"
    name = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and harness.poll() is None:
        text = log.read_text() if log.is_file() else ""
        match = re.search(r"--name (reprobox-[0-9a-f]+)", text)
        if match and _exists(engine, match.group(1)):
            name = match.group(1)
            break
        time.sleep(0.2)
    assert name is not None, f"no container started (harness exit {harness.poll()})"
    clients = [p for p in psutil.Process(harness.pid).children() if "run" in p.cmdline()]
    assert clients, "no `run` client under the harness"
    time.sleep(1.0)  # the watchdog has been told of the client's pid

    os.kill(harness.pid, signal.SIGKILL)
    harness.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _exists(engine, name):
        time.sleep(0.5)
    try:
        assert not _exists(engine, name), f"{name} still exists after the harness died"
        psutil.wait_procs(clients, timeout=30)
        assert not [c.pid for c in clients if c.is_running()], "the `run` client is left"
    finally:
        subprocess.run([engine.name, "rm", "-f", name], capture_output=True, timeout=60)
        for client in clients:
            if client.is_running():
                client.kill()
