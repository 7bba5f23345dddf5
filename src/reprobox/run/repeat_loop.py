"""The repeat loop of a noisy cell ([verdict] repeats): launches in one environment, each
with a fresh seed, until the stated test decides or the launches allowed are spent.

Every launch gets `REPRO_SEED` (the first launch's seed plus its index: `[verdict] seed`, else
drawn once per cell and recorded) and `REPRO_REPEAT` (its index from 0), its own folder
(`repeat-NNN/` under the cell's run folder), and the one judge; `core.repeat_verdict` turns the
judgements into the cell's one. On a back end that runs launches apart (`concurrent`) with
`--workers K`, K launches run at once. A repro without `repeats` never comes here: it runs
exactly one launch, as always. A flaky bisect's probe (`only`) is one launch of the cell, the
n-th, judged alone: the bisect's posterior weighs every launch, so a probe is one observation,
never a repeated verdict (which could end undecided and stop the bisect).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reprobox.core import repeat_verdict
from reprobox.core.judge import Judgement, Launched
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record
from reprobox.core.spec import Repro
from reprobox.run import capabilities, phases
from reprobox.run.backend import Backend, Case, LaunchRequest, Prepared

SEED_ENV = "REPRO_SEED"
REPEAT_ENV = "REPRO_REPEAT"
# Drawn seeds stay below 2**24: a script may multiply its seed (kl takes a block of --seeds
# per launch) and numpy refuses seeds of 2**32 and above.
SEED_RANGE = 2**24
JudgeCase = Callable[[Repro, Case, Launched, "list[Verdict] | None"], Judgement]


def declared(repro: Repro, variant: str) -> bool:
    """Whether the variant's outcome is declared noisy (judged from repeated launches)."""
    return repro.noisy(variant)


def run(
    repro: Repro,
    record: Record,
    prepared: Prepared,
    request: LaunchRequest,
    backend: Backend,
    workers: int,
    judge_case: JudgeCase,
    only: int | None = None,
) -> None:
    """Launch the request's one case repeatedly and put the cell's judgement in `record`
    (its samples kept in it as they come: an interrupt saves every launch already judged);
    with `only`, launch that repeat alone (its seed and REPRO_REPEAT) and keep its verdict."""
    cell = request.lead.cell
    section = repro.verdict(cell.variant)
    first = section.seed if section.seed is not None else secrets.randbelow(SEED_RANGE)
    width = workers if workers > 1 and capabilities.concurrent(backend) is not None else 1
    judged: list[Judgement] = []
    samples: list[dict[str, Any]] = []

    def one(index: int) -> tuple[int, Judgement, Launched, dict[str, Any]]:
        case = Case(cell, request.lead.args, request.lead.run_dir / f"repeat-{index:03d}")
        case.run_dir.mkdir(parents=True, exist_ok=False)
        env = {**request.launch.env, SEED_ENV: str(first + index), REPEAT_ENV: str(index)}
        launch = request.launch.model_copy(update={"env": env})
        phases.emit(phases.PhaseKind.LAUNCHING, f"repeat {index + 1}")
        launched = backend.launch(
            prepared, dataclasses.replace(request, launch=launch, cases=(case,))
        )
        phases.emit(phases.PhaseKind.JUDGING, f"repeat {index + 1}")
        judgement = judge_case(repro, case, launched, None)
        sample = {
            "repeat": index,
            "seed": first + index,
            "verdict": judgement.verdict.value if judgement.verdict else None,
            "status": judgement.status.value,
            "metrics": dict(judgement.metrics),
            "dir": str(case.run_dir),
            "wall_s": launched.wall_s,
            "exit_code": int(judgement.exit_code),
        }
        if judgement.verdict is None:
            sample["reason"] = judgement.reason
        return index, judgement, launched, sample

    def launches(indexes: range, pool: ThreadPoolExecutor | None) -> list[Any]:
        if pool is None:  # one at a time, in this thread (where an interrupt lands)
            return [one(index) for index in indexes]
        try:
            return list(pool.map(phases.in_context(one), indexes))
        except KeyboardInterrupt:
            cancel = capabilities.canceller(backend)
            if cancel is not None:
                cancel()
            raise

    if only is not None:
        _, judgement, launched, sample = one(only)
        record.apply(judgement, launched)
        record.samples = [sample]
        return
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="repeat") if width > 1 else None
    last: Launched | None = None
    wall = 0.0
    try:
        while True:
            top = repeat_verdict.most(section)
            sprt = section.test == "sprt"
            stop = (
                min(len(judged) + width, top)
                if sprt
                else repeat_verdict.next_look(section, len(judged))
            )
            while len(judged) < stop:
                for _, judgement, launched, sample in launches(
                    range(len(judged), min(stop, len(judged) + width)), pool
                ):
                    judged.append(judgement)
                    samples.append(sample)
                    wall, last = wall + launched.wall_s, launched
                record.samples = list(samples)  # kept if an interrupt ends the cell
                if any(j.verdict in (None, Verdict.CANNOT_TEST) for j in judged):
                    break  # an error or cannot-test ends the cell
            verdict = repeat_verdict.aggregate(section, cell.expect, cell.also_ok, judged, samples)
            if repeat_verdict.decided(verdict) or len(judged) >= top:
                break
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    assert last is not None
    record.apply(verdict, last)
    record.wall_s = wall
