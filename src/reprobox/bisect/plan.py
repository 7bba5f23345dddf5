"""What a bisect will cost, before and while it runs: `bisect --dry-run`'s plan and the
"about N steps left" its progress shows.

Both come from the same counts, so the plan and the live estimate agree: the two ends, then
the search (binary: at most ceil(log2(gaps)) probes for the gaps between candidates; K workers:
ceil(log_{K+1}(gaps)) rounds of up to K probes), then `confirm` re-runs of each boundary
probe and `verify` probes on each side. A flake-aware search (`--flaky`) has no such bound:
its count is a stated estimate, capped by `--max-runs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from reprobox.bisect import checks
from reprobox.bisect.axes import Axis
from reprobox.bisect.strategy import Strategy
from reprobox.bisect.summary import ProbeEntry

VERSION = 1


def search_steps(gaps: int, workers: int = 1) -> int:
    """Probes (one worker) or rounds (K workers) a search needs at most to close `gaps`
    gaps between a known start-side and a known end-side candidate."""
    if gaps <= 1:
        return 0
    return math.ceil(math.log(gaps, workers + 1) - 1e-9)


def flaky_estimate(n_items: int, confidence: float, max_runs: int) -> int:
    """A rough count for the flake-aware search: each of its about log2(N)+2 decisions
    (the ends and the halvings) repeated about log2(1/(1-confidence)) times, at most
    `max_runs`."""
    decisions = math.ceil(math.log2(max(n_items, 2))) + 2
    repeats = math.ceil(math.log2(1 / (1 - confidence)))
    return min(max_runs, decisions * repeats)


def metric_estimate(n_items: int, confidence: float, min_shift: float, max_runs: int) -> int:
    """A rough count for the metric search at the smallest shift that counts (a larger
    shift takes fewer): each of its about log2(N)+2 decisions needs about
    2 ln(N / (1 - confidence)) / (min_shift^2 / 2) launches (the evidence one launch gives
    between two sides min_shift sd apart), at most `max_runs`."""
    decisions = math.ceil(math.log2(max(n_items, 2))) + 2
    per = 2 * math.log(max(n_items, 2) / (1 - confidence)) / (min_shift**2 / 2)
    return min(max_runs, math.ceil(decisions * per))


class PlanOutput(BaseModel):
    """`bisect --dry-run`: the candidates, the ends it would check and what it would cost;
    nothing is launched."""

    version: int = VERSION
    command: Literal["bisect"] = "bisect"
    dry_run: Literal[True] = True
    exit_code: int = 0
    kind: str  # release, date, commit
    repro: str
    variant: str
    platform: str
    candidates: list[str]  # oldest first, both ends in; yanked ones in and marked
    yanked: list[str] = []
    ends: tuple[str, str]  # good, bad: probed first
    strategy: Literal["binary", "multisection", "flaky", "shift"]
    workers: int = 1
    ends_probes: int = 2
    search_probes: int  # at most (flaky: estimated, the ends and repeats included)
    search_rounds: int  # K workers: rounds of up to K probes at once (binary: = probes)
    confirm_probes: int = 0
    verify_probes: int = 0  # at most: only untried candidates on each side are probed
    probes: int  # the total: at most, or (estimate) a stated estimate; a date bisect's
    # delta debugging of the answer day comes on top (the rule says so)
    estimate: bool = False  # True: `probes` is an estimate, not a bound
    rule: str  # how `probes` was counted, in words


def plan(axis: Axis[Any], strategy: Strategy, repro: str, variant: str,
         platform: str) -> PlanOutput:  # fmt: skip
    """The plan of a bisect of `axis` as `strategy` would run it."""
    question = axis.question
    names, asked = list(question.names), question.asked.kind
    n, workers = len(names), strategy.workers
    ends = tuple(
        question.shown(axis.name(end)) if end is not None else default
        for end, default in ((question.good, names[0]), (question.bad, names[-1]))
    )
    common = dict(kind=asked, repro=repro, variant=variant, platform=platform,
                  candidates=names, yanked=list(question.asked.yanked), ends=ends,
                  workers=workers)  # fmt: skip
    if strategy.flaky and strategy.metric is not None:
        total = metric_estimate(n, strategy.confidence, strategy.min_shift, strategy.max_runs)
        return PlanOutput(
            **common, strategy="shift", ends_probes=0, search_probes=total, search_rounds=total,
            probes=total, estimate=True,
            rule=f"estimate at a shift of {strategy.min_shift:g} sd of {strategy.metric} (larger "
            f"shifts take fewer): about (log2({n})+2) decisions x 2 ln({n}/(1-"
            f"{strategy.confidence})) / ({strategy.min_shift:g}^2/2) launches each; it stops at "
            f"confidence {strategy.confidence} or --max-runs {strategy.max_runs}",
        )  # fmt: skip
    if strategy.flaky:
        total = flaky_estimate(n, strategy.confidence, strategy.max_runs)
        return PlanOutput(
            **common, strategy="flaky", ends_probes=0, search_probes=total, search_rounds=total,
            probes=total, estimate=True,
            rule=f"estimate: about (log2({n})+2) decisions x log2(1/(1-{strategy.confidence})) "
            f"runs each; it stops at confidence {strategy.confidence} or --max-runs "
            f"{strategy.max_runs}",
        )  # fmt: skip
    rounds = search_steps(n - 1, workers)
    search = rounds * workers
    confirm = 2 * strategy.confirm
    per_side = checks.default_verify(n) if strategy.verify is None else strategy.verify
    verify = min(2 * per_side, max(n - 2 - search, 0))
    kind: Literal["binary", "multisection"] = "binary" if workers == 1 else "multisection"
    how = f"ceil(log2({n - 1} gaps)) = {rounds}"
    if workers > 1:
        how = f"ceil(log_{workers + 1}({n - 1} gaps)) = {rounds} rounds of up to {workers}"
    return PlanOutput(
        **common, strategy=kind, search_probes=search, search_rounds=rounds,
        confirm_probes=confirm, verify_probes=verify, probes=2 + search + confirm + verify,
        rule=f"2 ends + {how} + {strategy.confirm} confirm x 2 boundary probes + "
        f"up to {per_side} verify per side; a skipped candidate adds a probe"
        + ("; the answer day's package changes are then narrowed by delta debugging, "
           "which this count leaves out" if asked == "date" else ""),
    )  # fmt: skip


class StepsLeft:
    """ "About N steps left" while a plain search runs: from the probes so far, the open gap
    between the last start-side and the first end-side candidate, and what confirm and
    verify still add. None for a flake-aware search or a map (no bound to state)."""

    def __init__(self, names: Sequence[str], strategy: Strategy) -> None:
        self.index = {name: i for i, name in enumerate(names)}
        self.strategy, self.n = strategy, len(names)
        self.first: str | None = None  # the verdict of the start end, once probed
        self.lo, self.hi = 0, self.n - 1
        self.seen_ends: set[int] = set()
        self.confirms = self.late = 0
        per_side = checks.default_verify(self.n) if strategy.verify is None else strategy.verify
        self.verify = 2 * per_side

    def after(self, entry: ProbeEntry) -> int | None:
        """The steps left once `entry` is in; None when there is no bound."""
        if self.strategy.flaky or self.strategy.mapping:
            return None
        at = self.index.get(entry.item)
        workers = self.strategy.workers
        if entry.attempt > 1:
            self.confirms += 1
        elif at in (0, self.n - 1) and at not in self.seen_ends and entry.verdict:
            self.seen_ends.add(at)
            if at == 0:
                self.first = entry.verdict
        elif at is not None and entry.verdict and self.lo < at < self.hi:
            start_side = self.first is None or entry.verdict == self.first
            self.lo, self.hi = (at, self.hi) if start_side else (self.lo, at)
        elif self.hi - self.lo <= 1:
            self.late += 1  # a verify probe
        ends = 2 - len(self.seen_ends)
        search = search_steps(self.hi - self.lo, workers)
        confirm = max(0, 2 * self.strategy.confirm - self.confirms)
        verify = max(0, min(self.verify, self.n - 2) - self.late)
        return ends + search + confirm + verify
