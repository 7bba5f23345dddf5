"""The pipeline with a fake back end: no uv, no ranks. What it decides (preflight, batching,
recording, interruption) is tested here; the back ends themselves run for real elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import FIXTURES
from fakes import FakeBackend
from reprobox.core import spec
from reprobox.core.cells import make_cell
from reprobox.core.errors import ExitCode
from reprobox.core.protocol import RankExit
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.run import pipeline


@pytest.fixture
def toy() -> Repro:
    return spec.load_file(FIXTURES / "repros" / "toy" / "repro.toml", FIXTURES / "fixes")


@pytest.fixture
def store(tmp_path: Path) -> RecordStore:
    return RecordStore(tmp_path / "results")


def _run(toy: Repro, store: RecordStore, backend: FakeBackend, *variants: str) -> list[Record]:
    cells = [make_cell(toy, v) for v in variants]
    lock = Path(__file__)  # any file: the fake back end never reads it
    settings = Settings.from_env({"REPROBOX_RESULTS": str(store.base)})
    return pipeline.run_cells(toy, cells, backend, store, settings, pipeline.RunOptions(lock=lock))


def test_every_cell_gets_a_saved_judged_record(toy: Repro, store: RecordStore) -> None:
    backend = FakeBackend(
        {"clean": ("clean", 0.0, [0, 0]), "reproduced": ("reproduced", 1, [1, 1])}
    )
    records = _run(toy, store, backend, "clean", "reproduced")
    assert [(r.verdict, r.status) for r in records] == [
        ("clean", "match"), ("reproduced", "match")
    ]  # fmt: skip
    assert {r.label for r in store.latest("toy")} == {"clean", "reproduced"}
    assert records[0].exits == [RankExit(rank=0, code=0), RankExit(rank=1, code=0)]
    assert pipeline.exit_code(records) is ExitCode.OK


def test_a_rank_that_contradicts_the_result_is_an_error(toy: Repro, store: RecordStore) -> None:
    backend = FakeBackend({"clean": ("clean", 0.0, [0, -11])})
    [record] = _run(toy, store, backend, "clean")
    assert record.status == "error" and record.verdict is None
    assert "rank 1 was killed by SIGSEGV" in record.reason
    assert record.result["verdict"] == "clean"  # what was measured is kept
    assert pipeline.exit_code([record]) is ExitCode.RUN_FAILED


def test_a_preflight_can_end_a_cell_or_let_it_launch(toy: Repro, store: RecordStore) -> None:
    backend = FakeBackend({"early": ("clean", 0.0, [0, 0]), "preflight_ok": ("clean", 0, [0, 0])},
                          preflight={"early": 125})  # fmt: skip
    early, ok = _run(toy, store, backend, "early", "preflight_ok")
    assert early.verdict == "cannot_test" and early.status == "match"
    assert ok.verdict == "clean" and ok.status == "match"
    launched = [(r.lead.cell.variant, r.preflight is not None) for r in backend.launches]
    assert launched == [("early", True), ("preflight_ok", True), ("preflight_ok", False)]


def test_a_preflight_that_fails_is_an_error_not_a_skip(toy: Repro, store: RecordStore) -> None:
    backend = FakeBackend({}, preflight={"early": 3})
    [record] = _run(toy, store, backend, "early")
    assert record.status == "error" and "preflight exited 3" in record.reason


def test_batching_shares_one_launch_and_checks_the_batch_code(
    toy: Repro, store: RecordStore
) -> None:
    batched = toy.spec.model_copy(
        update={"launch": toy.spec.launch.model_copy(update={"batch": True})}
    )
    repro = Repro(toy.name, toy.dir, batched, toy.fixes_dir)
    # every rank exits 1: one case reproduced, so the batch's code is 1 for both cases
    backend = FakeBackend(
        {"clean": ("clean", 0.0, [1, 1]), "reproduced": ("reproduced", 1, [1, 1])}
    )
    records = _run(repro, store, backend, "clean", "reproduced")
    assert len(backend.launches) == 1 and len(backend.launches[0].cases) == 2
    assert [r.status for r in records] == ["match", "match"]
    assert records[1].batch_dir == records[0].dir


def test_an_environment_failure_is_recorded_and_the_next_cell_runs(
    toy: Repro, store: RecordStore
) -> None:
    backend = FakeBackend({"reproduced": ("reproduced", 1, [1, 1])}, broken_env={"clean"})
    clean, reproduced = _run(toy, store, backend, "clean", "reproduced")
    assert clean.status == "error" and clean.exit_code == ExitCode.ENV_FAILED
    assert reproduced.status == "match"


def test_an_interrupt_keeps_what_was_recorded_and_marks_the_cell(
    toy: Repro, store: RecordStore
) -> None:
    backend = FakeBackend({"clean": ("clean", 0.0, [0, 0])}, interrupt_on="reproduced")
    with pytest.raises(KeyboardInterrupt):
        _run(toy, store, backend, "clean", "reproduced", "cannot")
    records = {r.label: r for r in store.latest("toy")}
    assert records["clean"].status == "match"
    assert records["reproduced"].reason == "interrupted"
    assert records["reproduced"].exit_code == ExitCode.INTERRUPTED
    assert "cannot" not in records  # never started: no folder left behind
    assert not (store.base / "toy" / "cpu-cannot").exists()


def test_the_record_names_the_variables_the_back_end_declares(
    toy: Repro, store: RecordStore
) -> None:
    [record] = _run(toy, store, FakeBackend({"clean": ("clean", 0.0, [0, 0])}), "clean")
    assert record.env_names == ["FAKE_ONLY"]  # the back end's own word, never guessed


@dataclass
class ThreadedBackend(FakeBackend):
    """Declares concurrent launches: the pipeline runs `workers` at once, and cancels them
    all on an interrupt."""

    concurrent: bool = True
    cancelled: int = 0

    def cancel_all(self) -> None:
        self.cancelled += 1


def test_capabilities_are_declared_and_checked_in_one_place() -> None:
    from reprobox.run import capabilities

    plain, threaded = FakeBackend(), ThreadedBackend()
    assert capabilities.concurrent(plain) is None and capabilities.many(plain) is None
    assert capabilities.canceller(plain) is None
    assert capabilities.concurrent(threaded) is threaded
    assert capabilities.canceller(threaded) == threaded.cancel_all
    # cancel_all alone, or `concurrent = False`, declares nothing
    assert capabilities.concurrent(ThreadedBackend(concurrent=False)) is None


def test_a_concurrent_back_end_is_cancelled_on_an_interrupt(toy: Repro, store: RecordStore) -> None:
    backend = ThreadedBackend({"clean": ("clean", 0.0, [0, 0])}, interrupt_on="reproduced")
    cells = [make_cell(toy, v) for v in ("clean", "reproduced")]
    settings = Settings.from_env({"REPROBOX_RESULTS": str(store.base)})
    options = pipeline.RunOptions(lock=Path(__file__), workers=2)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_cells(toy, cells, backend, store, settings, options)
    assert backend.cancelled == 1
    assert {r.label: r.reason for r in store.latest("toy")}["reproduced"] == "interrupted"


def test_a_back_end_without_the_hosts_torch_is_bad_input_under_host(
    toy: Repro, store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reprobox.core.errors import BadInput
    from reprobox.run import host_check

    monkeypatch.setattr(host_check, "host_range", lambda repro, platform: None)
    prepared = FakeBackend().prepare(toy, make_cell(toy, "clean"), Path(__file__))
    with pytest.raises(BadInput, match="the fake back end does not run with the host's torch"):
        host_check.check(toy, "cpu", prepared)


def test_the_factory_always_gives_a_back_end(tmp_path: Path) -> None:
    from reprobox.core.errors import BadInput
    from reprobox.run.backends import BackendFlags, ContainerFlags, SlurmFlags, make_backend
    from reprobox.run.backends.detached import DetachedBackend
    from reprobox.run.backends.venv import VenvBackend

    settings = Settings.from_env({"REPROBOX_RESULTS": str(tmp_path)})
    assert type(make_backend("venv", settings)) is VenvBackend
    assert type(make_backend("venv", settings, BackendFlags(workers=3))) is DetachedBackend
    with pytest.raises(BadInput, match="--gres goes with --backend slurm"):
        make_backend("venv", settings, BackendFlags(slurm=SlurmFlags(gres="gpu:1")))
    with pytest.raises(BadInput, match="--engine goes with --backend container"):
        make_backend("venv", settings, BackendFlags(container=ContainerFlags(engine="docker")))
    with pytest.raises(BadInput, match="--workers: must be 1 or more, not 0"):
        make_backend("venv", settings, BackendFlags(workers=0))
    with pytest.raises(BadInput, match="--backend k8s: want one of venv, container, slurm"):
        make_backend("k8s", settings)
    with pytest.raises(TypeError):  # no kind is a caller's bug, never "the venv"
        make_backend(None, settings)  # type: ignore[arg-type]
