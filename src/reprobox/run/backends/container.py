"""Pinned container images: build a variant's image from its lock (images.py), run the
variant inside with podman or docker (engine.py), judge the result exactly as the venv path
does.

Whichever engine is present and answers runs it; a run is killed and removed at its timeout
or on Ctrl-C, so no container is left behind, and it is confined (engine.py). `push` sends a
built image to a registry and records the digest it got (images.py, run/pushes.py).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Literal

from reprobox.core.cells import Cell
from reprobox.core.errors import BadInput
from reprobox.core.judge import Launched
from reprobox.core.protocol import CACHE_ENV, PLAN_ENV, RESULT_ENV
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.envs.torch_source import find_links
from reprobox.run import watchdog
from reprobox.run.backend import PLAN_FILE, RESULT_FILE, LaunchRequest, Prepared, plan_text
from reprobox.run.backends.engine import SHM_GIB, Engine, find_engine
from reprobox.run.backends.images import (
    COMMITS_LABEL,
    LOCK_LABEL,
    ImageSpec,
    build,
    image_id,
    image_of,
    image_spec,
    prune,
    push,
    stored,
)
from reprobox.run.exits import last_error, launcher_exits
from reprobox.run.installs import resolve_sources
from reprobox.run.layout import CACHE, IN_IMAGE, OUT, case_out, container_argv
from reprobox.run.pushes import Pushed
from reprobox.run.rank_logs import collect_rank_logs

# What callers name here (the CLI, tests): the engine and the images.
__all__ = [
    "COMMITS_LABEL", "LOCK_LABEL", "ContainerBackend", "Engine", "ImageSpec", "build",
    "check_memory", "default_memory", "find_engine", "image_of", "image_spec", "prune", "push",
    "stored",
]  # fmt: skip

MEMORY_PER_PROCESS_GIB = 4  # a run's memory bound by default: per rank, plus /dev/shm


def default_memory(processes: int) -> str:
    """The memory bound of a run with `processes` ranks (`--memory` overrides it)."""
    return f"{MEMORY_PER_PROCESS_GIB * processes + SHM_GIB}g"


def check_memory(text: str) -> str:
    """`--memory` as both engines take it (a number with b, k, m or g), or a plain error."""
    if not re.fullmatch(r"[1-9][0-9]*[bkmg]?", text.strip().lower()):
        raise BadInput(f"--memory {text!r}: want a size such as 16g or 512m")
    return text.strip().lower()


def _passed(request: LaunchRequest) -> list[str]:
    """The [launch] pass_env names set in the harness's environment."""
    return [name for name in request.launch.pass_env if name in os.environ]


class ContainerBackend:
    """Runs launches inside each variant's pinned image (podman or docker), judged exactly
    as venv runs are: the pipeline's preflight, batching and judge apply unchanged. Safe to
    launch from several threads at once (each launch its own container, named apart), and
    each image is built once however many threads ask for it."""

    name = "container"
    concurrent: Literal[True] = True

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        base: str | None = None,
        no_cache: bool = False,
        memory: str | None = None,
    ) -> None:
        self.settings, self.engine, self.no_cache = settings, engine, no_cache
        self.base = base or settings.base_image
        self.memory = check_memory(memory) if memory else None  # None: default_memory
        self.built: list[tuple[str, bool, float]] = []  # (tag, built now, seconds)
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}  # one build of a tag at a time
        self._live: set[str] = set()  # the containers running now
        self._stopping = threading.Event()

    @property
    def engine_name(self) -> str:
        return self.engine.name

    def prepare(self, repro: Repro, cell: Cell, lock: Path) -> Prepared:
        _, commits = resolve_sources(dict(cell.packages), self.settings)  # resolved already
        spec = image_spec(self.settings.root, repro, cell.variant, cell.platform, lock, commits)
        logs = self.settings.results / repro.name / "_images" / spec.tag.rsplit(":", 1)[-1]
        started = time.monotonic()
        with self._lock:
            building = self._building.setdefault(spec.tag, threading.Lock())
        with building:
            built = build(
                self.engine,
                spec,
                base=self.base,
                ca_bundle=self.settings.ca_bundle,
                log_dir=logs,
                cache=self.settings.cache,
                wheels=find_links(self.settings),
                no_cache=self.no_cache and spec.tag not in {t for t, _, _ in self.built},
            )
            with self._lock:
                self.built.append((spec.tag, built, time.monotonic() - started))
            digest = image_id(self.engine, spec.tag)
        if built:  # the disk bound (REPROBOX_IMAGE_DISK), oldest first; never this run's
            with self._lock:
                keep = {tag for tag, _, _ in self.built}
            prune(self.engine, self.settings.image_disk, keep)
        return Prepared(
            key=spec.tag,
            lock=lock,
            lock_hash=spec.tag.rsplit("-", 1)[-1],
            runner=f"{self.engine.name} {spec.tag}",
            env_s=time.monotonic() - started,
            handle=spec,
            image=digest,
            machine=(("dev_shm", f"{SHM_GIB:.1f} GiB"),),  # --shm-size, not the host's
        )

    def push(self, prepared: Prepared, registry: str) -> Pushed:
        """Push the prepared image to `registry` and record the digest it got."""
        return push(self.engine, prepared.handle, registry, self.settings.results)

    def cancel_all(self) -> None:
        """Kill and remove every container this back end runs (an interrupt reached the
        harness); their launches then end as interrupted, never as verdicts."""
        self._stopping.set()
        with self._lock:
            live = list(self._live)
        for name in live:
            self.engine.remove(name)

    def _run_argv(self, prepared: Prepared, request: LaunchRequest, name: str) -> list[str]:
        spec = image_of(prepared.handle)
        lead = request.lead
        preflight = list(request.preflight) if request.preflight is not None else None
        if len(request.cases) > 1 and preflight is None:
            plan = lead.run_dir / PLAN_FILE
            paths = [str(case_out(i) / RESULT_FILE) for i in range(len(request.cases))]
            plan.write_text(plan_text(request, paths))
            protocol, args = {PLAN_ENV: str(OUT / PLAN_FILE)}, []
        else:
            protocol, args = {RESULT_ENV: str(OUT / RESULT_FILE)}, list(lead.args)
        env = {**request.launch.env, **protocol, CACHE_ENV: str(CACHE),
               "PYTHONPATH": str(IN_IMAGE["fixes"]), "HF_HUB_OFFLINE": "1"}  # fmt: skip
        cache = self.settings.cache / "repro-cache" / f"{request.repro.name}-image"
        cache.mkdir(parents=True, exist_ok=True)
        out = request.log_dir
        out.mkdir(parents=True, exist_ok=True)
        memory = self.memory or default_memory(request.launch.processes)
        cmd = [self.engine.name, "run", "--rm", "--name", name,
               *self.engine.confine_flags(memory), *self.engine.user_flags(),
               *self.engine.out_mount(out), *self.engine.out_mount(cache, CACHE)]  # fmt: skip
        for index, case in enumerate(request.cases[1:], start=1):
            cmd += self.engine.out_mount(case.run_dir, case_out(index))
        for key, value in env.items():
            cmd += ["-e", f"{key}={value}"]
        for key in _passed(request):  # the engine reads the value here: never in the argv
            cmd += ["-e", key]
        gpus = self.engine.gpu_flags() if spec.platform == "gpu" else []
        argv = container_argv(request.repro, lead.cell.variant, args, preflight=preflight)
        return [*cmd, *gpus, spec.tag, *argv]

    def command(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        return self._run_argv(prepared, request, "reprobox-NAME")

    def env_names(self, prepared: Prepared, request: LaunchRequest) -> list[str]:
        """The variables the harness hands the container (`-e`; names only, for the
        record): nothing of its own environment but [launch] pass_env."""
        argv = self._run_argv(prepared, request, "reprobox-NAME")
        return sorted({argv[i + 1].split("=", 1)[0] for i, a in enumerate(argv[:-1]) if a == "-e"})

    def launch(self, prepared: Prepared, request: LaunchRequest) -> Launched:
        if self._stopping.is_set():
            raise KeyboardInterrupt
        name = f"reprobox-{uuid.uuid4().hex[:12]}"
        cmd = self._run_argv(prepared, request, name)
        log = request.log_dir / "launch.log"
        started = time.monotonic()
        timed_out = False
        # If the harness dies (kill -9), its watchdog removes the container: `podman run`
        # and the container itself would otherwise run on for ever.
        guard = watchdog.Watcher(name)
        guard.container(self.engine.name, name)
        with log.open("wb") as sink:
            sink.write(f"$ {shlex.join(cmd)}\n".encode())
            sink.flush()
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
            guard.process(proc.pid)
            with self._lock:
                self._live.add(name)
            try:
                proc.wait(timeout=request.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                self.engine.remove(name)
                proc.wait()
            except BaseException:
                self.engine.remove(name)
                proc.wait()
                raise
            finally:
                # `--rm` is podman's own clean-up, which can end after `podman run` has
                # returned (CI saw the container listed after the run): remove it here too.
                self.engine.remove(name)
                guard.done()
                with self._lock:
                    self._live.discard(name)
        if self._stopping.is_set():  # cancel_all removed it: interrupted, not a verdict
            raise KeyboardInterrupt
        if request.preflight is not None and (request.log_dir / RESULT_FILE).is_file():
            # The preflight's /out is its own folder; its result is the cell's.
            (request.log_dir / RESULT_FILE).replace(request.lead.result)
        rank_logs = collect_rank_logs(request.log_dir)
        return Launched(
            exits=() if timed_out else launcher_exits(proc.returncode, log),
            timed_out=timed_out,
            timeout=request.timeout,
            wall_s=time.monotonic() - started,
            logs=request.lead.run_dir,
            last_error=last_error([log, *rank_logs]),
            launcher_stops_peers=True,
            stopped=f"container {name} killed and removed",
        )
