"""The prober: (item, attempt) -> verdict, by way of injected work, logged for resumption.

What a probe does is injected (`Probes`: a `run` that returns an `Outcome`, and an
`env_key` naming the environment an item resolves to), so skip classification,
same-environment reuse and resumption are tested with fakes. `pipeline_probes` is the one
place that wires probes to real runs: a lock per item, `pipeline.run_cell`, and `classify`,
which turns the run's record into an outcome.

The rule: clean or reproduced is a verdict; cannot-test (125) or an environment that cannot be
resolved or installed is a skip (it widens the answer); anything else (a crash, a timeout, a
tampered lock, a harness error) stops the bisect, since guessing past it could name the
wrong release. The log keeps everything measured before the stop.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import urlparse

from packaging.utils import canonicalize_name

from reprobox.bisect.probe_log import ProbeLog
from reprobox.bisect.search import Job, SearchError, ThreadRunner
from reprobox.bisect.summary import LOG_FILE, ProbeEntry
from reprobox.core.cells import Cell, make_cell
from reprobox.core.errors import BadInput, ExitCode, ReproboxError, Terminated
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record, RecordStore
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro, check_version
from reprobox.envs import git, venvs
from reprobox.run import pipeline
from reprobox.run.backend import Backend
from reprobox.run.backends import make_backend
from reprobox.run.capabilities import canceller, images

T = TypeVar("T")
# A skip measured off the main thread waits this long before it is logged: a Ctrl-C at the
# terminal also kills that thread's uv, and its "cannot install" must not be kept as a skip.
SKIP_HOLD_S = 0.5

# Exit codes of an environment that could not be made: the probe is a skip, not a stop.
SKIP_CODES = frozenset({ExitCode.ENV_FAILED, ExitCode.BAD_INPUT})
INTERRUPT_CODES = frozenset({130, 129, 143})  # Ctrl-C, SIGHUP, SIGTERM


class BisectError(BadInput):
    """The question cannot be answered as asked (untestable or equal endpoints)."""


class ProbeFailed(ReproboxError):
    """A probe neither gave a verdict nor could be skipped: the bisect stops."""


@dataclass(frozen=True)
class Target:
    """What every probe runs: one variant of one repro, on one platform, with the process's
    settings (where results go and records on disk are read; the cache; torch's source),
    where probes launch (a back end, or the kind the registry builds: "venv" unless said),
    and the other packages every probe runs at (`overrides`: a version, `git+URL@REF` or a
    checkout's `file://` path; `pin_overrides` fixes each source to one commit, named in
    `commits`, for a whole bisect)."""

    repro: Repro
    variant: str
    options: pipeline.RunOptions
    settings: Settings
    backend: Backend | str = "venv"
    overrides: Mapping[str, str] = field(default_factory=dict)
    commits: Mapping[str, str] = field(default_factory=dict)  # package -> sha or checkout state
    # a flaky bisect: a probe of a noisy variant is one launch, an observation (run/repeat_loop.py)
    one_launch: bool = False
    metric: str | None = None  # a metric search: the metric each probe's launch reports

    def packages(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A probe's package overrides: the target's, then the item's own (`extra`)."""
        return {**self.overrides, **(extra or {})}

    def header(self) -> dict[str, Any]:
        """What a probe log's header adds for the overrides (nothing without any, so logs
        of bisects without them keep their names): a moved ref is another bisect."""
        if not self.overrides:
            return {}
        return {
            "overrides": dict(sorted(self.overrides.items())),
            "override_commits": dict(sorted(self.commits.items())),
        }

    def note(self) -> str:
        """What an answer line adds for the overrides (`overrides_note`)."""
        return overrides_note(self.overrides, self.commits)

    def same_overrides(self, packages: Mapping[str, str], commits: Mapping[str, str]) -> bool:
        """Whether a record's (or summary's) other packages are exactly this target's, so its
        verdicts speak about this bisect's environments."""
        mine = {canonicalize_name(k): v for k, v in self.overrides.items()}
        theirs = {canonicalize_name(k): v for k, v in packages.items()}
        if mine != theirs:
            return False
        ran = {canonicalize_name(k): v for k, v in commits.items()}
        return all(ran.get(canonicalize_name(k)) == v for k, v in self.commits.items())

    @property
    def root(self) -> Path:
        return self.settings.root

    @property
    def results(self) -> Path:
        return self.settings.results


def overrides_note(overrides: Mapping[str, str], commits: Mapping[str, str]) -> str:
    """`; with flagpkg at commit <sha>`: the other packages an answer holds for."""
    parts = [
        f"{name} at commit {commits[name]}" if name in commits else f"{name}=={value}"
        for name, value in sorted(overrides.items())
    ]
    return f"; with {', '.join(parts)}" if parts else ""


def pin_overrides(target: Target, searched: Iterable[str]) -> Target:
    """The target with each source override fixed for the whole bisect, resolved once, now: a
    branch, tag or pull request's ref becomes its sha (so every probe runs the same commit,
    however the ref moves meanwhile), its wheel is built (a commit that does not build stops
    here, exit 3, rather than making every probe a skip), and a checkout's state is noted
    (`check_checkouts` refuses a probe once it changes). Overriding a package the bisect
    searches is bad input: the search would never see its own versions."""
    names = {canonicalize_name(p) for p in searched}
    pinned: dict[str, str] = {}
    commits: dict[str, str] = {}
    for package, value in target.overrides.items():
        if canonicalize_name(package) in names:
            raise BadInput(
                f"--with {package}: that is a package this bisect searches; override "
                "other packages only"
            )
        target.repro.check_pinned(package, "--with")
        if git.is_git_source(value):
            url, ref = git.split_source(value)
            url = git.normalize_url(url)
            sha = git.resolve(url, ref, target.settings)
            git.commit_wheel(url, sha, package, target.settings)
            pinned[package], commits[package] = f"git+{url}@{sha}", sha
        elif value.startswith("file://"):
            label, _ = git.checkout_wheel(Path(urlparse(value).path), package, target.settings)
            pinned[package], commits[package] = value, label
        else:
            check_version(value, f"--with {package}")
            pinned[package] = value
    return replace(target, overrides=pinned, commits=commits)


def check_checkouts(target: Target) -> None:
    """BadInput when a checkout given with --with-editable changed since the bisect began:
    probes before and after would have run different code under one name."""
    for package, value in target.overrides.items():
        if not value.startswith("file://"):
            continue
        now, _ = git.checkout_wheel(Path(urlparse(value).path), package, target.settings)
        if now != target.commits.get(package):
            raise BadInput(
                f"the checkout of {package} changed during the bisect (was "
                f"{target.commits.get(package)}, now {now}): every probe must run the same "
                "code; restore it, or run the bisect again to start a new one"
            )


@dataclass(frozen=True)
class Outcome:
    """What one probe run gave: a verdict, a skip, or an error that stops the bisect."""

    kind: Literal["verdict", "skip", "error"]
    verdict: Verdict | None = None  # clean or reproduced, for kind == "verdict"
    reason: str = ""
    record: str | None = None  # the run folder
    wall_s: float = 0.0
    exit_code: int = int(ExitCode.RUN_FAILED)  # for kind == "error"
    value: float | None = None  # the metric a metric search reads (Target.metric), if reported


@dataclass(frozen=True)
class Probes(Generic[T]):
    """The injected work of a prober.

    `run(item, attempt)` runs one probe. `env_key(item)` names the environment the item
    resolves to (items with equal keys share one run); it raises a ReproboxError when the
    environment cannot be resolved (a skip for ENV_FAILED / BAD_INPUT, else a stop).
    `warm(item)` prepares an item's environment ahead of time (optional). `versions(item)`
    lists the packages an item installs (date bisects diff them). `cancel()` stops every
    run in progress (an interrupt while several probes run at once)."""

    run: Callable[[T, int], Outcome]
    env_key: Callable[[T], str]
    warm: Callable[[T], None] | None = None
    versions: Callable[[T], dict[str, str]] | None = None
    cancel: Callable[[], None] | None = None


class Prober(Generic[T]):
    """(item, attempt) -> verdict, or None to skip; each probe measured once, ever.

    A probe already in the log is not run again; one whose environment equals an earlier
    probe's (same env key, same attempt) reuses that verdict. `runs` lists this session's
    probes in order, each once. Safe to call from several threads (`probe_all`, the
    parallel search): probes run at once, the bookkeeping and log appends one at a time."""

    def __init__(
        self,
        probes: Probes[T],
        log: ProbeLog,
        describe: Callable[[T], str] = str,
        *,
        tags: Callable[[T], list[str]] | None = None,
        on_probe: Callable[[ProbeEntry], None] | None = None,
    ) -> None:
        self.probes, self.log, self.describe = probes, log, describe
        self.tags = tags
        self.on_probe = on_probe
        self.runs: list[ProbeEntry] = []
        self._seen: dict[str, ProbeEntry] = {}
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._lock = threading.RLock()  # the log, `runs` and `on_probe`: one thread at a time
        self._stopping = threading.Event()

    def __call__(self, item: T, attempt: int) -> Verdict | None:
        return self.entry(item, attempt).outcome

    def entry(self, item: T, attempt: int = 1) -> ProbeEntry:
        """The probe's entry: from this session, from the log, or measured now."""
        key = f"{self.describe(item)}#{attempt}"
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None:
                return entry
            logged = self.log.get(key)
            if logged is not None:
                return self._keep(key, logged.model_copy(update={"resumed": True}))
        entry = self._measure(item, attempt, key)  # outside the lock: K probes at once
        if entry.skip and threading.current_thread() is not threading.main_thread():
            self._stopping.wait(SKIP_HOLD_S)
        with self._lock:
            if self._stopping.is_set():
                raise KeyboardInterrupt  # measured while the search was being stopped
            self.log.add(entry)
            return self._keep(key, entry)

    def _keep(self, key: str, entry: ProbeEntry) -> ProbeEntry:
        self._seen[key] = entry
        self.runs.append(entry)
        if self.on_probe is not None:
            self.on_probe(entry)
        return entry

    def stop(self) -> None:
        """An interrupt: stop every probe in progress and keep none that ends from now on
        (the log holds what finished before)."""
        self._stopping.set()
        if self.probes.cancel is not None:
            self.probes.cancel()

    def probe_all(self, jobs: Sequence[tuple[T, int]], workers: int) -> list[Verdict | None]:
        """Every (item, attempt) of `jobs`, `workers` at a time; the verdicts in job order.
        A stop (a crash) or an interrupt is raised once the probes already running end."""
        if workers <= 1 or len(jobs) <= 1:
            return [self(item, attempt) for item, attempt in jobs]
        runner: ThreadRunner[T] = ThreadRunner(self, workers, on_interrupt=self.stop)
        verdicts: dict[int, Verdict | None] = {}
        waiting = list(enumerate(jobs))
        running = 0
        try:
            while waiting or running:
                while waiting and running < workers:
                    number, (item, attempt) = waiting.pop(0)
                    runner.start(Job(number, item, attempt))
                    running += 1
                for job, verdict in runner.wait():
                    verdicts[job.index] = verdict
                    running -= 1
        except BaseException as exc:
            runner.abort(isinstance(exc, KeyboardInterrupt))
            raise
        runner.close()
        return [verdicts[number] for number in range(len(jobs))]

    def values(self, jobs: Sequence[tuple[T, int]], workers: int) -> list[float | None]:
        """A metric search's probes: each (item, attempt)'s value of the metric, None for a
        skip. A launch judged without the value stops the bisect: a missing sample is never
        read as a skip (it would widen the answer in silence)."""
        self.probe_all(jobs, workers)
        found: list[float | None] = []
        for item, attempt in jobs:
            entry = self.entry(item, attempt)
            if entry.verdict is not None and entry.value is None:
                raise ProbeFailed(
                    self._stop_message(entry.item, "its launch reported no value of the metric"),
                    exit_code=ExitCode.RUN_FAILED,
                )
            found.append(entry.value if entry.verdict is not None else None)
        return found

    def seen(self, item: T) -> bool:
        """Whether this session has probed `item` (any attempt)."""
        name = self.describe(item)
        return any(entry.item == name for entry in self.runs)

    def _measure(self, item: T, attempt: int, key: str) -> ProbeEntry:
        name = self.describe(item)
        base: dict[str, Any] = {
            "key": key,
            "item": name,
            "attempt": attempt,
            "tags": self.tags(item) if self.tags else [],
        }
        try:
            env_key = self.probes.env_key(item)
        except ReproboxError as exc:
            if exc.exit_code in SKIP_CODES:
                return ProbeEntry(**base, skip=True, reason=str(exc))
            raise ProbeFailed(self._stop_message(name, str(exc)), exit_code=exc.exit_code) from None
        base["lock_hash"] = env_key
        with self._lock:
            logged = list(self.log.entries.values())
        for earlier in logged:
            # Another item that resolved to the very same environment (days often do).
            if earlier.lock_hash == env_key and earlier.attempt == attempt:
                return ProbeEntry(
                    **base,
                    verdict=earlier.verdict,
                    value=earlier.value,
                    skip=earlier.skip,
                    reason=earlier.reason,
                    record=earlier.record,
                    same_as=earlier.item,
                )
        outcome = self.probes.run(item, attempt)
        base.update(record=outcome.record, wall_s=round(outcome.wall_s, 3))
        if outcome.kind == "verdict" and outcome.verdict in (Verdict.CLEAN, Verdict.REPRODUCED):
            word: Literal["clean", "reproduced"] = (
                "clean" if outcome.verdict is Verdict.CLEAN else "reproduced"
            )
            return ProbeEntry(**base, verdict=word, value=outcome.value, reason=outcome.reason)
        if outcome.kind == "skip":
            return ProbeEntry(**base, skip=True, reason=outcome.reason)
        code = outcome.exit_code
        if code in (ExitCode.OK, ExitCode.FAILED, ExitCode.CANNOT_TEST):
            code = int(ExitCode.RUN_FAILED)  # never let a stop read as a verdict
        raise ProbeFailed(self._stop_message(name, outcome.reason), exit_code=ExitCode(code))

    def _stop_message(self, name: str, reason: str) -> str:
        return (
            f"probe {name} failed ({reason}); fix it and run the same bisect again: finished "
            f"probes are kept in {self.log.path}"
        )

    def prefetch(self, items: Sequence[T]) -> None:
        """Prepare the environments the next step may need while the current probe runs."""
        if self.probes.warm is None:
            return
        for item in items:
            if self.log.get(f"{self.describe(item)}#1") is None:
                self._background.submit(self._warm, item)

    def _warm(self, item: T) -> None:
        assert self.probes.warm is not None
        try:
            self.probes.warm(item)
        except ReproboxError:
            pass  # the probe itself will meet the same failure and classify it

    def close(self) -> None:
        self._background.shutdown(wait=True, cancel_futures=True)


@contextmanager
def answering(advice: Callable[[SearchError], str] | None = None) -> Iterator[None]:
    """Turn the pure search's errors into the harness's BadInput (exit 2), with advice."""
    try:
        yield
    except SearchError as exc:
        extra = advice(exc) if advice is not None else ""
        raise BisectError(f"{exc}{extra}") from None


# -- the production wiring -----------------------------------------------------------------


def classify(record: Record, metric: str | None = None) -> Outcome:
    """A probe's record as an outcome (see the module docstring for the rule); with
    `metric`, the launch's value of it too (a metric search's sample)."""
    where = record.dir or None
    wall = record.wall_s + record.preflight_s  # a probe's run time: its preflight and launch
    if record.verdict in (Verdict.CLEAN.value, Verdict.REPRODUCED.value):
        verdict = Verdict(record.verdict)
        value = record.metrics.get(metric) if metric is not None else None
        return Outcome("verdict", verdict, record.reason, where, wall, value=value)
    if record.verdict == Verdict.CANNOT_TEST.value:
        return Outcome("skip", None, record.reason or "cannot test", where, wall)
    if record.exit_code == ExitCode.ENV_FAILED:
        return Outcome("skip", None, record.reason, where, wall)
    if record.exit_code in INTERRUPT_CODES:
        # The same interrupt the run met, so the bisect ends with its code (130/129/143).
        signum = {129: signal.SIGHUP, 143: signal.SIGTERM}.get(record.exit_code)
        raise KeyboardInterrupt if signum is None else Terminated(signum)
    return Outcome("error", None, record.reason, where, wall, exit_code=record.exit_code)


def pipeline_probes(
    target: Target,
    lock_of: Callable[[T], Path],
    cell_of: Callable[[T], Cell],
    runs: Path,
) -> Probes[T]:
    """Probes that run the target through the pipeline, each against `lock_of(item)`.

    Resolution happens in `env_key` (so a release that cannot resolve is a skip before any
    launch); the run then installs and launches against that lock, its folder under `runs`."""
    repro, options, settings = target.repro, target.options, target.settings
    platform = options.platform
    chosen = target.backend
    backend = make_backend(chosen, settings) if isinstance(chosen, str) else chosen
    store = RecordStore(settings.results)

    def env_key(item: T) -> str:
        return venvs.env_hash(lock_of(item), *pipeline.env_inputs(repro, platform))

    def run(item: T, attempt: int) -> Outcome:
        try:
            check_checkouts(target)
        except BadInput as exc:
            return Outcome("error", reason=str(exc), exit_code=int(ExitCode.BAD_INPUT))
        probe_options = pipeline.RunOptions(
            platform=platform,
            echo=options.echo,
            timeout=options.timeout,
            lock=lock_of(item),
            results_base=runs,
            only_launch=attempt - 1 if target.one_launch else None,
        )
        cell = cell_of(item).on(platform)
        [record] = pipeline.run_cells(repro, [cell], backend, store, settings, probe_options)
        return classify(record, target.metric)

    builds = images(backend)

    def warm(item: T) -> None:
        if builds is not None:  # the probe's image (built once, whichever thread asks first)
            builds.prepare(repro, cell_of(item).on(platform), lock_of(item))
        else:
            pipeline.ensure_env(repro, lock_of(item), platform, settings=settings)

    def versions(item: T) -> dict[str, str]:
        return lock_versions(lock_of(item))

    cancel = canceller(backend)
    return Probes(run=run, env_key=env_key, warm=warm, versions=versions, cancel=cancel)


def release_probes(target: Target, package: str, runs: Path) -> Probes[str]:
    """Probes of one package's releases: the variant's lock with that package at a version
    (and the target's other overrides, the same in every probe)."""
    repro, platform = target.repro, target.options.platform

    def lock_of(version: str) -> Path:
        packages = target.packages({package: version})
        return pipeline.lock_for(
            repro, target.variant, platform, packages, settings=target.settings
        )

    def cell_of(version: str) -> Cell:
        return make_cell(repro, target.variant, target.packages({package: version}), None, platform)

    return pipeline_probes(target, lock_of, cell_of, runs)


def lock_versions(lock: Path) -> dict[str, str]:
    """package -> version of every exact pin of a lock (`envs.venvs.lock_pins`, as text)."""
    return {name: str(version) for name, version in venvs.lock_pins(lock.read_text()).items()}


def default_log(target: Target, header: dict[str, Any]) -> Path:
    """Same arguments and the same verdict rule, same log: re-running a bisect resumes it. A
    changed `[verdict]` (its effect, budget or test) starts a new log: a sweep re-asked after
    sft_default_dtype's effect was corrected read back the verdicts judged by the old one."""
    rule = target.repro.verdict(target.variant).model_dump(mode="json")
    keyed = json.dumps({**header, "verdict": rule}, sort_keys=True)
    digest = hashlib.sha256(keyed.encode()).hexdigest()[:10]
    name = f"{header['kind']}-{header.get('package', 'stack')}-{digest}"
    return RecordStore(target.results).bisect_dir(target.repro.name) / name / LOG_FILE
