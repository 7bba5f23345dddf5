"""nox sessions for reprobox. Thin: the harness (src/reprobox) does the work.

nox -t default                 every repro's default variants (the main job; `make repro`)
nox -s repro_lm_head           every cell of one repro: the default cell and its matrix
nox -s "repro_lm_head(default)"
nox -t corpus                  every corpus repro's default variants (repros with a [truth])
nox -s corpus [-- REPROS]      the corpus questions graded against each truth: docs/corpus.md
nox -s verdicts                the newest verdict of every cell on disk, as a table
nox -s lock [-- REPRO]         regenerate the committed locks from repro.toml
nox -s tests [-- PYTEST ARGS]  the test suite
nox -s lint
nox -s gpu_check [-- ARGS]     a one-GPU host with its own torch: verdicts as one JSON
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

from reprobox.core import spec
from reprobox.scaleout import noxview

ROOT = Path(__file__).parent
HARNESS = [sys.executable, "-m", "reprobox"]  # the interpreter running nox has the harness
AXES = noxview.index_axes(
    os.environ
)  # matrix range axes, resolved against the index of the settings

nox.needs_version = ">=2026.10.20"
nox.options.default_venv_backend = "uv"
nox.options.tags = ["default"]  # plain `nox` runs the main job
nox.options.error_on_missing_interpreters = True


def _harness(session: nox.Session, command: str, *args: str) -> None:
    """`reprobox <command>` with the session's arguments after `--`."""
    session.run(*HARNESS, command, *args, *session.posargs, external=True)


def _register_repro(name: str) -> None:
    names, cells, warning = noxview.session_cells(ROOT, name, AXES)

    def run_cell(session: nox.Session, **call_spec: str | None) -> None:
        if warning:
            session.warn(warning)
        cell = next(c for c in cells if c.call_spec == call_spec)
        _harness(session, "run", name, *cell.args)

    run_cell.__doc__ = f"{spec.load(ROOT, name).spec.repro.title}"
    params = [nox.param(*c.call_spec.values(), id=c.id, tags=c.tags) for c in cells]
    parametrized = nox.parametrize(names, params)(run_cell)
    nox.session(name=f"repro_{name}", venv_backend="none")(parametrized)


for _name in spec.discover(ROOT):
    _register_repro(_name)


@nox.session(venv_backend="none")
def verdicts(session: nox.Session) -> None:
    """The newest verdict of every default cell on disk (`-- --all` for every cell)."""
    repros = [arg for arg in session.posargs if arg != "--all"]
    default = [] if "--all" in session.posargs else ["--default"]
    session.run(*HARNESS, "table", *default, *repros, external=True)


@nox.session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """Regenerate from repro.toml: a hashed lock per (repro, variant, platform), Dockerfiles."""
    _harness(session, "lock")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite: unit tests of the harness and real end-to-end runs of each repro.

    On REPROBOX_TEST_WORKERS pytest-xdist workers (default: the cores, at most 8, + 2: 4 on a 2-core
    machine; 0 runs in one process): the two Slurm modules' groups mostly wait (time limits,
    heartbeats, rendezvous timeouts), so each takes a worker of its own while the others
    compute, one a core.
    tests/conftest.py groups what must share one worker and orders the run; xdist keeps that
    order (--no-loadscope-reorder) instead of starting the largest groups first."""
    session.install("-e", ".[test]")
    # the processors this run may use (Linux says; elsewhere all of them), at most 8
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity else os.cpu_count() or 1
    workers = os.environ.get("REPROBOX_TEST_WORKERS") or str(min(cores, 8) + 2)
    # Bytecode is written (an empty PYTHONDONTWRITEBYTECODE is unset): where a shell or CI
    # image sets it, every `reprobox` start the suite makes compiled the harness and pydantic,
    # rich & co. again, 0.45 s of CPU a start instead of 0.22 s here (uv installs no bytecode).
    session.run("pytest", "-n", workers, "--dist", "loadgroup", "--no-loadscope-reorder",
                *session.posargs, env={"PYTHONDONTWRITEBYTECODE": ""})  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format), the import rules (import-linter) and mypy."""
    session.install("-e", ".[test]")
    paths = ["src", "repros", "fixes", "tests", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.run("lint-imports")  # the layer rules of pyproject's [tool.importlinter]
    session.run("mypy")  # strict on core and bisect ([tool.mypy])
    session.run("mypy", "tests/fakes.py")  # the fakes still match the protocols they stand for


@nox.session(venv_backend="none")
def corpus(session: nox.Session) -> None:
    """Every corpus repro asked what its [truth] answers, graded: docs/corpus.md
    (-- [REPROS] [--cases K]); `nox -t corpus` runs their default verdicts only."""
    _harness(session, "corpus")


@nox.session(venv_backend="none")
def bisect(session: nox.Session) -> None:
    """Where a verdict flips: -- <repro> [--package P --good V --bad V | --by-date A..B]."""
    _harness(session, "bisect")


@nox.session(venv_backend="none")
def sweep(session: nox.Session) -> None:
    """Every release of a range, as affected ranges: -- <repro> --package P --range SPEC."""
    _harness(session, "sweep")


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """Upstream-ready report from results on disk: -- REPRO [--out DIR] [--post OWNER/REPO#N]."""
    _harness(session, "report")


@nox.session(venv_backend="none")
def bundle(session: nox.Session) -> None:
    """A folder + .tar.gz that runs a repro with no reprobox: -- REPRO [--variant V] [-o DIR]."""
    _harness(session, "bundle")


@nox.session(venv_backend="none")
def k8s(session: nox.Session) -> None:
    """A Kubernetes Indexed Job, one pod per cell, images by digest: -- REPRO --registry R."""
    _harness(session, "k8s")


@nox.session(venv_backend="none")
def image(session: nox.Session) -> None:
    """A variant's pinned image: -- REPRO --variant V [--platform P] [--run] [--push REGISTRY]."""
    _harness(session, "image")


@nox.session(venv_backend="none")
def gpu_check(session: nox.Session) -> None:
    """A one-GPU host with its own torch: kl's 1-GPU pair and signed KL, lm_head, one JSON:
    -- [--wheelhouse DIR] [--out FILE] [--dry-run]. Stops at once (125) with no GPU."""
    _harness(session, "gpu-check")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks that print their figures as JSON: -- lm_head | bisect | images | kl |
    noisy_bisect [--trials N] | signed_kl_null | scrub."""
    if not session.posargs:
        session.error("which benchmark? -- lm_head | bisect | images | kl | noisy_bisect | ...")
    name, *rest = session.posargs
    session.run(sys.executable, f"tests/bench/bench_{name}.py", *rest, external=True)
