"""The pipeline's `launch_many` hook (a Slurm array) with a fake back end: launches handed
over at once, each judged and recorded as it ends, in the order they end; a failed
submission is every cell's record; an interrupt closes the back end's iterator and keeps
what was recorded. The Slurm back end itself runs for real in tests/test_slurm.py."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import FIXTURES
from fakes import FakeBackend
from reprobox.core import spec
from reprobox.core.cells import make_cell
from reprobox.core.errors import LaunchError, LaunchTimeout, ReproboxError
from reprobox.core.judge import Launched
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro
from reprobox.run import pipeline
from reprobox.run.backend import LaunchRequest, Prepared

SCRIPT = {"clean": ("clean", 0.0, [0, 0]), "reproduced": ("reproduced", 1.0, [1, 1]),
          "wrong": ("reproduced", 1.0, [1, 1])}  # fmt: skip


@dataclass
class ManyBackend(FakeBackend):
    """Launches in the order `order` names (indices), one failing as `fails` says."""

    order: list[int] = field(default_factory=list)
    fails: dict[int, ReproboxError] = field(default_factory=dict)
    refuse: ReproboxError | None = None  # the whole submission
    interrupt_after: int | None = None  # yields this many, then Ctrl-C
    closed: bool = False
    handed: int = 0

    def launch_many(
        self, launches: Sequence[tuple[Prepared, LaunchRequest]], workers: int
    ) -> Generator[tuple[int, Launched | ReproboxError], None, None]:
        self.handed = len(launches)
        if self.refuse is not None:
            raise self.refuse
        try:
            for count, index in enumerate(self.order or range(len(launches))):
                if count == self.interrupt_after:
                    raise KeyboardInterrupt
                prepared, request = launches[index]
                yield index, self.fails.get(index) or self.launch(prepared, request)
        finally:
            self.closed = True


@pytest.fixture
def toy() -> Repro:
    return spec.load_file(FIXTURES / "repros" / "toy" / "repro.toml", FIXTURES / "fixes")


def _run(toy: Repro, tmp_path: Path, backend: ManyBackend, seen: list[str]) -> list[Record]:
    store = RecordStore(tmp_path / "results")
    cells = [make_cell(toy, v) for v in ("clean", "reproduced", "wrong")]
    settings = Settings.from_env({"REPROBOX_RESULTS": str(store.base)})
    options = pipeline.RunOptions(lock=Path(__file__))

    def on_record(record: Record) -> None:
        assert Path(record.dir, "record.json").is_file()  # saved before it is reported
        seen.append(record.label)

    return pipeline.run_cells(toy, cells, backend, store, settings, options,
                              on_record=on_record)  # fmt: skip


def test_each_launch_is_recorded_as_it_ends(toy: Repro, tmp_path: Path) -> None:
    timeout = LaunchTimeout("slurm job 7_0 ran past its time limit (1)")
    backend = ManyBackend(SCRIPT, order=[2, 0, 1], fails={0: timeout})
    seen: list[str] = []
    records = _run(toy, tmp_path, backend, seen)
    assert backend.handed == 3 and backend.launches  # one hand-over, not launch() per cell
    assert seen == ["wrong", "clean", "reproduced"]  # in the order they ended
    assert [r.label for r in records] == ["clean", "reproduced", "wrong"]  # in cell order
    clean, reproduced, wrong = records
    assert clean.status == "error" and clean.exit_code == 124 and "7_0" in clean.reason
    assert reproduced.status == "match" and wrong.status == "mismatch"


def test_a_refused_submission_is_every_cells_record(toy: Repro, tmp_path: Path) -> None:
    refusal = LaunchError("cannot submit the job (sbatch): sbatch: error: Invalid gres")
    seen: list[str] = []
    records = _run(toy, tmp_path, ManyBackend(SCRIPT, refuse=refusal), seen)
    assert len(records) == 3 and len(seen) == 3
    assert all(r.status == "error" and "Invalid gres" in r.reason and r.exit_code == 4
               for r in records)  # fmt: skip


def test_an_interrupt_closes_the_launches_and_keeps_the_records(toy: Repro, tmp_path: Path) -> None:
    backend = ManyBackend(SCRIPT, interrupt_after=1)
    seen: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _run(toy, tmp_path, backend, seen)
    assert backend.closed and seen == ["clean"]
    saved = {r.label: r for r in RecordStore(tmp_path / "results").latest("toy")}
    assert saved["clean"].status == "match"
    assert saved["reproduced"].reason == saved["wrong"].reason == "interrupted"


def test_one_launch_takes_the_plain_path(toy: Repro, tmp_path: Path) -> None:
    backend = ManyBackend(SCRIPT)
    store = RecordStore(tmp_path / "results")
    settings = Settings.from_env({"REPROBOX_RESULTS": str(store.base)})
    [record] = pipeline.run_cells(toy, [make_cell(toy, "clean")], backend, store, settings,
                                  pipeline.RunOptions(lock=Path(__file__)))  # fmt: skip
    assert record.status == "match" and backend.handed == 0  # a probe: one job of its own
