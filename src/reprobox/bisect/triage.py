"""Bisections for real: every probe is a repro run, logged for resumption, its successor's
environment prepared in the background while it runs.

Release bisection searches the releases of one package between a good and a bad one. Date
bisection resolves the stack as of each day (uv's exclude-newer, per floated package), finds
the first day whose resolution flips the verdict, then delta-debugs the difference between
the last day before and that day to name the package(s) that flip it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from reprobox.bisect.log import ProbeLog
from reprobox.bisect.search import BisectError, BisectResult, bisect, ddmin
from reprobox.core import cells as matrix
from reprobox.core.errors import BadInput, ExitCode, LaunchError, ReproboxError
from reprobox.core.protocol import Verdict
from reprobox.core.records import results_dir
from reprobox.core.spec import Repro
from reprobox.envs import locks, venvs
from reprobox.envs.index import PackageIndex, select
from reprobox.run import pipeline as workflow


@dataclass(frozen=True)
class Target:
    """What every probe runs: one variant of one repro, on one platform."""

    root: Path
    repro: Repro
    variant: str
    options: workflow.RunOptions


class Prober:
    """(item, attempt) -> verdict, by running the repro against the item's lock.

    A probe already in the log is not run again. 125 and environments that cannot be
    resolved or installed are skips (None); a crash or timeout stops the bisection, since
    guessing past it could name the wrong release (the log keeps what was measured).
    """

    def __init__(
        self,
        target: Target,
        log: ProbeLog,
        prepare: Callable[[Any], Path],
        describe: Callable[[Any], str],
        cell_for: Callable[[Any], matrix.Cell],
        on_probe: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.target, self.log, self.prepare, self.describe = target, log, prepare, describe
        self.cell_for = cell_for
        self.on_probe = on_probe
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self.runs: list[dict[str, Any]] = []  # this session's probes, each once
        self._seen: dict[str, dict[str, Any]] = {}

    def __call__(self, item: Any, attempt: int) -> Verdict | None:
        key = f"{self.describe(item)}#{attempt}"
        entry = self._seen.get(key)
        if entry is None:
            entry = self.log.get(key)
            if entry is None:
                entry = self._run(item, attempt, key)
                self.log.add(entry)
            else:
                entry = {**entry, "resumed": True}  # measured by an earlier, interrupted run
            self._seen[key] = entry
            self.runs.append(entry)
            if self.on_probe is not None:
                self.on_probe(entry)
        return Verdict(entry["verdict"]) if entry["verdict"] else None

    def _run(self, item: Any, attempt: int, key: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"key": key, "item": self.describe(item), "attempt": attempt}
        try:
            lock = self.prepare(item)
        except ReproboxError as exc:
            return {**entry, "verdict": None, "skip": True, "reason": str(exc), "wall_s": 0.0}
        repro, platform = self.target.repro, self.target.options.platform
        digest = venvs.env_hash(lock, *workflow.env_inputs(repro, platform))
        entry["lock_hash"] = digest
        for earlier in list(self.log.entries.values()):
            # Another item that resolved to the very same environment (days often do).
            if earlier.get("lock_hash") == digest and earlier["attempt"] == attempt:
                same = {k: earlier.get(k) for k in ("verdict", "reason", "skip", "record")}
                return {**entry, **same, "same_as": earlier["item"]}
        # Probe records live beside the log, not among the cells' newest results.
        runs = self.log.path.parent / "runs"
        options = replace(self.target.options, lock=lock, results_base=runs)
        record = workflow.run_cell(self.target.root, repro, self.cell_for(item), options)
        # A probe's run time: the script's preflight check and its launch.
        entry.update(wall_s=round(record.wall_s + record.preflight_s, 3), record=record.dir)
        if record.verdict in (Verdict.CLEAN, Verdict.REPRODUCED):
            return {**entry, "verdict": record.verdict, "reason": record.reason}
        if record.verdict == Verdict.CANNOT_TEST or record.exit_code in (
            ExitCode.ENV_FAILED,
            ExitCode.BAD_INPUT,
        ):
            return {**entry, "verdict": None, "skip": True, "reason": record.reason}
        if record.exit_code == ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
        raise LaunchError(
            f"probe {self.describe(item)} failed ({record.reason}); fix it and run the same "
            f"bisect again: finished probes are kept in {self.log.path}",
            exit_code=ExitCode(record.exit_code),
        )

    def prefetch(self, items: Sequence[Any]) -> None:
        """Prepare the environments the next step may need while the current probe runs."""
        for item in items:
            if self.log.get(f"{self.describe(item)}#1") is None:
                self._background.submit(self._warm, item)

    def _warm(self, item: Any) -> None:
        repro, platform = self.target.repro, self.target.options.platform
        try:
            workflow.ensure_env(repro, self.prepare(item), platform)
        except ReproboxError:
            pass  # the probe itself will meet the same failure and skip

    def close(self) -> None:
        self._background.shutdown(wait=True, cancel_futures=True)


# -- release bisection ---------------------------------------------------------------------


def release_range(index: PackageIndex, package: str, good: str, bad: str) -> list[str]:
    """The releases from the older to the newer endpoint, oldest first, endpoints included."""
    if Version(good) == Version(bad):
        raise BadInput(f"--good and --bad are the same release ({good}): nothing to bisect")
    releases = index.releases(package)
    known = {r.version for r in releases}
    for end, value in (("--good", good), ("--bad", bad)):
        if Version(value) not in known:
            raise BadInput(f"{end} {package} {value} does not exist on the index")
    lo, hi = sorted([Version(good), Version(bad)])
    inside = select(releases, f">{lo},<{hi}")
    return [str(lo), *(str(v) for v in inside), str(hi)]


def release_bisect(
    target: Target,
    package: str,
    good: str,
    bad: str,
    index: PackageIndex,
    *,
    confirm: int = 1,
    log_path: Path | None = None,
    on_probe: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    repro = target.repro
    if canonicalize_name(package) not in repro.pinned_packages():
        raise BadInput(f"{package} is not a package that {repro.name} pins")
    versions = release_range(index, package, good, bad)
    header = {
        "kind": "release", "repro": repro.name, "variant": target.variant,
        "package": canonicalize_name(package), "good": good, "bad": bad,
        "platform": target.options.platform, "versions": versions,
    }  # fmt: skip
    log = ProbeLog(log_path or _default_log(target, header), header)

    def prepare(version: str) -> Path:
        return workflow.lock_for(repro, target.variant, target.options.platform, {package: version})

    def cell_for(version: str) -> matrix.Cell:
        return matrix.make_cell(repro, target.variant, {package: version})

    prober = Prober(target, log, prepare, str, cell_for, on_probe=on_probe)
    started = time.monotonic()
    try:
        _check_ends(prober, good, bad)
        result = bisect(versions, prober, confirm=confirm, prefetch=prober.prefetch)
    finally:
        prober.close()
    summary = _summary(header, result, prober, started, n_items=len(versions))
    summary["result"] = _sentence("release", f"{package} ", result)
    return _write_summary(log, summary)


def _check_ends(prober: Prober, good: Any, bad: Any) -> None:
    """Fail fast, before any search, when the ends are not what the user says they are."""
    for name, item, wanted in (("--good", good, Verdict.CLEAN), ("--bad", bad, Verdict.REPRODUCED)):
        verdict = prober(item, 1)
        if verdict is None:
            raise BisectError(f"{name} {item} cannot be tested here (see {prober.log.path})")
        if verdict is not wanted:
            raise BisectError(
                f"{name} {item} is {verdict.value}, not {wanted.value}: "
                "are --good and --bad the right way round?"
            )


def _sentence(noun: str, subject: str, result: BisectResult) -> str:
    """The one line a bisect ends with, like git bisect's."""
    kind = "clean" if result.end_verdict is Verdict.CLEAN else "reproducing"
    if result.status == "found":
        return f"first {kind} {noun}: {subject}{result.first_end}"
    if result.status == "ambiguous":
        listed = ", ".join(map(str, result.candidates))
        return f"first {kind} {noun} could be any of: {subject}{listed}"
    return (
        f"flaky: {subject}{', '.join(map(str, result.flaky))} gave different verdicts when "
        "repeated; no boundary claimed"
    )


# -- date bisection ------------------------------------------------------------------------


def parse_dates(text: str) -> tuple[date, date]:
    try:
        start_text, end_text = text.split("..")
        start, end = date.fromisoformat(start_text), date.fromisoformat(end_text)
    except ValueError:
        raise BadInput(f"--by-date {text!r}: want START..END as YYYY-MM-DD..YYYY-MM-DD") from None
    if start >= end:
        raise BadInput(f"--by-date {text!r}: START must be before END")
    return start, end


def date_bisect(
    target: Target,
    start: date,
    end: date,
    floats: Sequence[str],
    *,
    confirm: int = 1,
    log_path: Path | None = None,
    on_probe: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Which day's resolution flips the verdict, and which package change does it."""
    repro, platform = target.repro, target.options.platform
    if not floats:
        raise BadInput("a date bisect needs packages to float (--float, or [bisect] package)")
    pinned = repro.pinned_packages()
    for name in floats:
        if canonicalize_name(name) not in pinned:
            raise BadInput(f"--float {name}: not a package that {repro.name} pins")
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    header = {
        "kind": "date", "repro": repro.name, "variant": target.variant, "start": str(start),
        "end": str(end), "float": sorted(canonicalize_name(f) for f in floats),
        "platform": platform,
    }  # fmt: skip
    log = ProbeLog(log_path or _default_log(target, header), header)
    floated = {canonicalize_name(f) for f in floats}

    def prepare(item: Any) -> Path:
        if isinstance(item, date):
            return locks.cached_lock(_as_of(target, floated, item))
        return locks.cached_lock(_pinned(target, item))

    def describe(item: Any) -> str:
        return str(item) if isinstance(item, date) else "changes:" + ",".join(sorted(item[1]))

    def cell_for(item: Any) -> matrix.Cell:
        return matrix.make_cell(repro, target.variant)

    prober = Prober(target, log, prepare, describe, cell_for, on_probe=on_probe)
    started = time.monotonic()
    try:
        result = bisect(days, prober, confirm=confirm, prefetch=prober.prefetch)
        before = _lock_versions(prepare(result.last_start))
        after = _lock_versions(prepare(result.first_end))
        changes = sorted(name for name in {*before, *after} if before.get(name) != after.get(name))
        culprit: list[str] = []
        if result.status == "found" and changes:

            def flips(subset: list[str]) -> bool | None:
                pins = {**before, **{n: after.get(n) for n in subset}}
                item = ("set", tuple(sorted(subset)), tuple(sorted(pins.items(), key=str)))
                verdict = prober(item, 1)
                return None if verdict is None else verdict is result.end_verdict

            culprit = ddmin(changes, flips)
    finally:
        prober.close()
    summary = _summary(header, result, prober, started, n_items=len(days))
    described = [f"{n} {before.get(n, '(none)')} -> {after.get(n, '(none)')}" for n in changes]
    blamed = [f"{n} {before.get(n, '(none)')} -> {after.get(n, '(none)')}" for n in culprit]
    summary.update(changes=described, culprit=blamed)
    summary["result"] = _sentence("date", "", result)
    if result.status == "found":
        summary["result"] += "; culprit: " + (
            ", ".join(blamed) if blamed else "none (the two resolutions do not differ)"
        )
    return _write_summary(log, summary)


def _as_of(target: Target, floated: set[str], day: date) -> locks.LockRequest:
    """The repro's requirements with the floated packages unpinned and resolved as of `day`."""
    repro, platform = target.repro, target.options.platform
    requirements = []
    for pin in repro.requirements(target.variant, platform):
        name = canonicalize_name(re.split(r"[<>=!~;\[ ]", pin, maxsplit=1)[0])
        requirements.append(name if name in floated else pin)
    cutoff = (day + timedelta(days=1)).isoformat()  # everything uploaded on `day` counts
    return locks.LockRequest(
        requirements=tuple(requirements),
        python=repro.python(platform),
        platform=platform,
        exclude_newer=repro.spec.env.exclude_newer,
        exclude_newer_packages=tuple((name, cutoff) for name in sorted(floated)),
    )


def _pinned(target: Target, item: tuple) -> locks.LockRequest:
    """Exactly the given versions (a delta-debugging step between two resolutions)."""
    _, _, pins = item
    repro, platform = target.repro, target.options.platform
    return locks.LockRequest(
        requirements=tuple(f"{name}=={version}" for name, version in pins if version),
        python=repro.python(platform),
        platform=platform,
        exclude_newer=repro.spec.env.exclude_newer,
    )


_LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def _lock_versions(lock: Path) -> dict[str, str]:
    found = {}
    for line in lock.read_text().splitlines():
        if match := _LOCK_LINE.match(line):
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


# -- shared --------------------------------------------------------------------------------


def _default_log(target: Target, header: dict[str, Any]) -> Path:
    """Same arguments, same log: re-running a bisect resumes it."""
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:10]
    name = f"{header['kind']}-{header.get('package', 'stack')}-{digest}"
    return results_dir(target.root) / target.repro.name / "_bisect" / name / "probes.jsonl"


def _summary(
    header: dict[str, Any], result: BisectResult, prober: Prober, started: float, n_items: int
) -> dict[str, Any]:
    fresh = [r for r in prober.runs if not (r.get("resumed") or r.get("same_as"))]
    probe_time = sum(r.get("wall_s", 0.0) for r in fresh)
    return {
        **header,
        "status": result.status,
        "start_verdict": result.start_verdict.value,
        "end_verdict": result.end_verdict.value,
        "last_start": str(result.last_start),
        "first": str(result.first_end),
        "candidates": [str(c) for c in result.candidates],
        "flaky": [str(f) for f in result.flaky],
        "probes": prober.runs,
        "distinct_probed": len({r["item"] for r in prober.runs}),
        "runs": len(prober.runs),
        "launched": sum(1 for r in prober.runs if not (r.get("resumed") or r.get("same_as"))),
        "skips": sum(1 for r in prober.runs if r.get("skip")),
        "bound": math.ceil(math.log2(n_items)) + 2,
        "items": n_items,
        "wall_s": round(time.monotonic() - started, 3),
        "probe_wall_s": round(probe_time, 3),
    }


def _write_summary(log: ProbeLog, summary: dict[str, Any]) -> dict[str, Any]:
    path = log.path.with_name("summary.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    tmp.replace(path)
    summary["summary_path"] = str(path)
    return summary
