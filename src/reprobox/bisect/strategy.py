"""How the one driver searches an axis: the `Strategy` every bisect entry point takes.

A leaf of `bisect`: the driver, the plan, the axes and the CLI read it, it reads none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reprobox.core.counts import check_count
from reprobox.core.errors import BadInput
from reprobox.core.spec import Repro

# the posterior an answer needs: at 0.99, 0.5 - 1.5% of the simulated bisects in
# docs/noise.md named a wrong release; at 0.999, 0 of 200 (about 30% more runs)
DEFAULT_CONFIDENCE = 0.999
DEFAULT_MAX_RUNS = 300
DEFAULT_MIN_SHIFT = 0.25  # sd: the smallest shift of a metric's mean that is a change
# a metric search (`bisect.changepoint`) counts launches, not verdicts, and what it needs
# grows as 1 / min_shift^2: at 500 / 0.25^2 = 8000, every simulated history at the smallest
# shift that counts (a quarter sd, with the spread x1.5 or not, no change, the spread alone;
# 8 and 32 releases) was decided in >= 0.99 of searches (docs/noise.md); at 2000, 0.34 - 0.84
# of them; at 6000, "no change" over 32 releases in 0.986
METRIC_RUNS_SD2 = 500


def metric_budget(min_shift: float) -> int:
    """The default launches of a metric search: what deciding a shift of `min_shift` sd
    takes, `METRIC_RUNS_SD2 / min_shift^2`, at least DEFAULT_MAX_RUNS."""
    return max(DEFAULT_MAX_RUNS, math.ceil(METRIC_RUNS_SD2 / min_shift**2))


@dataclass(frozen=True)
class Strategy:
    """How the driver searches. `flaky`: the posterior search (`bisect.flaky`), stopping at
    `confidence` or after `max_runs` launches; `mapping`: no search, every item probed once
    (a sweep); else binary (`workers` 1) or a multisection (`workers` K), each boundary
    probe repeated `confirm` times, `verify` probes per side."""

    confirm: int = 1
    verify: int | None = None
    workers: int = 1
    flaky: bool = False
    confidence: float = DEFAULT_CONFIDENCE
    max_runs: int = DEFAULT_MAX_RUNS
    mapping: bool = False
    # a flaky bisect of a variant judged by a metric test: the metric its samples are read
    # for (`bisect.changepoint`), and the smallest shift of its mean that counts, in sd
    metric: str | None = None
    min_shift: float = DEFAULT_MIN_SHIFT

    def check(self) -> Strategy:
        """The strategy, or BadInput naming the first flag out of its range."""
        check_count("--confirm", self.confirm, least=0)
        if self.verify is not None:
            check_count("--verify", self.verify, least=0)
        check_count("--workers", self.workers)
        check_count("--max-runs", self.max_runs)
        if not 0.5 < self.confidence < 1:
            raise BadInput(f"--confidence {self.confidence}: want a number above 0.5 and below 1")
        if not 0 < self.min_shift < 100:
            raise BadInput(f"--min-shift {self.min_shift}: want a positive number of sd, below 100")
        return self


BINARY = Strategy()  # the entry points' default: binary, one worker, confirm 1


def declared_metric(repro: Repro, variant: str) -> str | None:
    """The metric a noisy variant's declared test reads (t, sign), or None (pass/fail): a
    flaky bisect of it searches the metric's samples, as the test does."""
    section = repro.verdict(variant)
    if section.repeats is None or section.test == "sprt":
        return None
    return section.metric


def declares_noise(repro: Repro, variant: str) -> bool:
    """Whether the variant's outcome is declared noisy (`[verdict] repeats`): its bisects
    are flake-aware unless told otherwise."""
    return repro.noisy(variant)
