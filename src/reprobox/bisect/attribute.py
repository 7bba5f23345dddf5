"""Cross-package attribution: which package's change between two environments flips a
variant's verdict, and at which of its releases.

The two ends are pin sets (a lock, a `pip freeze` file, or what uv resolves for the repro as
of a day). Every probe is a pin set too: the first end's pins with some of the second end's
changes applied, resolved exactly (a set that cannot install is a skip: cannot test). After
the ends are checked (as a bisect checks them: launched again before they are blamed), delta
debugging (`search.ddmin`) narrows the changes to the fewest that still flip the verdict; a
single package's change is then bisected over that package's releases, the other pins held
at the first end. Packages that flip it only together, because neither installs without the
other's change (transformers 5 needs huggingface-hub 1, 4.57 refuses it), are told apart
where their releases allow: one package's releases between the ends, pre-releases in, with
the others left to the resolver between their ends' versions; an edge across which the
others resolved alike is that package's alone. One log holds every probe, so running the
same question again resumes.

The answer assumes that one package's change flips the verdict (or the few named, together)
and that the verdict is monotone over that package's releases; it says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from reprobox.bisect import checks
from reprobox.bisect.dates import ChangeSet, as_of_request, pinned_request
from reprobox.bisect.probe_log import ProbeLog
from reprobox.bisect.prober import (
    BisectError,
    ProbeFailed,
    Prober,
    Probes,
    Target,
    answering,
    default_log,
    lock_versions,
    pipeline_probes,
)
from reprobox.bisect.releases import release_range
from reprobox.bisect.search import bisect, ddmin
from reprobox.bisect.summary import (
    AttributionDetails,
    BisectSummary,
    ProbeEntry,
    runs_dir,
    write_summary,
)
from reprobox.core.cells import Cell, make_cell
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.envs import locks
from reprobox.envs.index import PackageIndex
from reprobox.run import pipeline

# A probe: every package's exact version ("" = not installed), sorted by name.
Step = tuple[tuple[str, str], ...]
Pins = dict[str, str]

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
ASSUMPTION = "assuming one package's change flips it and its releases are monotone"


def read_pins(text: str, shown: str) -> Pins:
    """package -> exact version of a lock (`uv pip compile` output, hashes and comments
    included) or a `pip freeze` file. A line that pins no exact release (a URL, an editable,
    a range) is bad input: a probe could not install it again by name."""
    pins: Pins = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].rstrip(" \\").strip()
        if not line or raw[:1] in (" ", "\t", "#"):
            continue  # blank, a comment, or a lock's `--hash` / `# via` continuation
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            requirement = None
        specs = list(requirement.specifier) if requirement is not None else []
        if requirement is None or requirement.url or len(specs) != 1 or specs[0].operator != "==":
            raise BadInput(
                f"{shown}: line {number} ({line!r}) is not an exact pin NAME==VERSION; "
                "attribution compares releases, so each package must be pinned to one"
            )
        pins[str(canonicalize_name(requirement.name))] = specs[0].version
    if not pins:
        raise BadInput(f"{shown}: no pinned package in it (want a lock or a `pip freeze` file)")
    return pins


def is_date(text: str) -> bool:
    """Whether an end is a day (YYYY-MM-DD) rather than a file."""
    return _DATE.fullmatch(text) is not None


def end_pins(text: str, flag: str, target: Target, floats: Sequence[str]) -> Pins:
    """One end's pins: a lock or freeze file as written, or a day: what uv resolves for the
    variant with `floats` unpinned as of the end of that UTC day (as the date bisect does)."""
    if is_date(text):
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise BadInput(f"{flag} {text}: not a day (YYYY-MM-DD)") from None
        if not floats:
            raise BadInput(f"{flag} {text}: a day needs packages to float (--float, or [bisect])")
        floated = {str(canonicalize_name(target.repro.check_pinned(f, "--float"))) for f in floats}
        repro, platform = target.repro, target.options.platform
        base = pipeline.lock_request(repro, target.variant, platform)
        request = as_of_request(base, floated, day)
        return lock_versions(locks.cached_lock(request, target.settings))
    path = Path(text).expanduser()
    if not path.is_file():
        raise BadInput(f"{flag} {text}: not a file (a lock or `pip freeze` output) nor a day")
    try:
        body = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{flag} {text}: cannot be read ({exc})") from None
    return read_pins(body, f"{flag} {text}")


def differing(start: Mapping[str, str], end: Mapping[str, str]) -> list[str]:
    """The packages whose pin differs between the ends (added, removed or changed)."""
    return sorted(n for n in {*start, *end} if start.get(n, "") != end.get(n, ""))


def change_text(name: str, start: Mapping[str, str], end: Mapping[str, str]) -> str:
    """`transformers 4.57.6 -> 5.0.0` (`(none)` for a package one end lacks)."""
    return f"{name} {start.get(name) or '(none)'} -> {end.get(name) or '(none)'}"


class Steps:
    """The probes' pin sets and their names: `from`, `to`, `changes:a,b` (the first end
    with those packages at the second end's versions), `a==1.2` (a release step)."""

    def __init__(self, start: Pins, end: Pins) -> None:
        self.start, self.end = dict(start), dict(end)
        self.changes = differing(start, end)

    def applied(self, names: Iterable[str]) -> Step:
        pins = {**self.start, **{n: self.end.get(n, "") for n in names}}
        return tuple(sorted(pins.items()))

    def at(self, package: str, version: str) -> Step:
        return tuple(sorted({**self.start, package: version}.items()))

    def floated(self, package: str, version: str, others: Iterable[str]) -> Step:
        """`package` at `version`, each of `others` left to the resolver between its two
        ends' versions (a range value: see `floating`), the rest at the first end."""
        ranges = {}
        for name in others:
            low, high = sorted((self.start[name], self.end[name]), key=Version)
            ranges[name] = f">={low},<={high}"
        return tuple(sorted({**self.start, package: version, **ranges}.items()))

    def describe(self, step: Step) -> str:
        pins = dict(step)
        names = sorted({*pins, *self.start})
        moved = [n for n in names if pins.get(n, "") != self.start.get(n, "")]
        if not moved:
            return "from"
        if all(pins.get(n, "") == self.end.get(n, "") for n in moved):
            return "to" if moved == self.changes else "changes:" + ",".join(moved)
        return ",".join(
            f"{n} floated" if floating(pins.get(n, "")) else f"{n}=={pins.get(n) or '(none)'}"
            for n in moved
        )


def floating(value: str) -> bool:
    """Whether a step's value is a range left to the resolver, not one version."""
    return value[:1] in "<>"


def _digest(pins: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(pins.items())).encode()).hexdigest()[:16]


def attribute(
    target: Target,
    start: Pins,
    end: Pins,
    *,
    labels: tuple[str, str] = ("from", "to"),
    index: PackageIndex | None = None,
    confirm: int = 1,
    log_path: Path | None = None,
    on_probe: Callable[[ProbeEntry], None] | None = None,
    probes: Probes[Step] | None = None,
    next_step: Callable[[str, str, str], str] | None = None,
) -> BisectSummary:
    """Name the package (or the few, together) whose change from `start` to `end` flips the
    variant's verdict, then the release of it that does. `labels` name the ends as the user
    gave them; `probes` replaces the real runs (tests); `next_step(package, last, first)`
    says how to go on to the commit (empty: nothing to say)."""
    steps = Steps(start, end)
    if not steps.changes:
        raise BadInput(f"{labels[0]} and {labels[1]} pin the same versions: nothing differs")
    if confirm < 0:
        raise BadInput(f"--confirm {confirm}: want 0 or more")
    repro, platform = target.repro, target.options.platform
    header: dict[str, Any] = {
        "kind": "attribution", "repro": repro.name, "variant": target.variant,
        "platform": platform, "from": _digest(start), "to": _digest(end),
    }  # fmt: skip
    fields: dict[str, Any] = {
        "kind": "attribution", "repro": repro.name, "variant": target.variant,
        "platform": platform, "start": labels[0], "end": labels[1],
        "changes": [change_text(n, start, end) for n in steps.changes],
    }  # fmt: skip
    path = log_path or default_log(target, header)
    started = time.monotonic()
    with ProbeLog(path, header) as log:
        found = probes if probes is not None else _pipeline(target, runs_dir(path))
        prober: Prober[Step] = Prober(found, log, steps.describe, on_probe=on_probe)
        try:
            more = _search(prober, steps, labels, index, confirm)
        finally:
            prober.close()
    summary = BisectSummary.model_validate({**fields, **more})
    summary.probes = list(prober.runs)
    summary = summary.counts(prober.runs, len(steps.changes), time.monotonic() - started)
    summary.result = answer_line(summary, target.variant, next_step)
    return write_summary(path, summary)


def _pipeline(target: Target, runs: Path) -> Probes[Step]:
    """Each pin set resolved exactly (uv; the repro's python and platform, no date cut: the
    pins are the versions) and run through the pipeline."""
    repro, platform = target.repro, target.options.platform
    base = pipeline.lock_request(repro, target.variant, platform)

    def lock_of(step: Step) -> Path:
        exact = tuple((name, value) for name, value in step if not floating(value))
        ranges = tuple(f"{name}{value}" for name, value in step if floating(value))
        request = pinned_request(base, ChangeSet((), exact))
        request = dataclasses.replace(
            request, requirements=(*request.requirements, *ranges), exclude_newer=None
        )
        return locks.cached_lock(request, target.settings)

    def cell_of(step: Step) -> Cell:
        return make_cell(repro, target.variant, target.packages(), None, platform)

    return pipeline_probes(target, lock_of, cell_of, runs)


def _search(
    prober: Prober[Step],
    steps: Steps,
    labels: tuple[str, str],
    index: PackageIndex | None,
    confirm: int,
) -> dict[str, Any]:
    """The ends, delta debugging, its confirmation, then the culprit's releases; what the
    summary records."""
    first, last = steps.applied(()), steps.applied(steps.changes)
    shown = {first: labels[0], last: labels[1]}
    checks.check_ends(
        prober, first, last, shown=lambda s: shown.get(s, steps.describe(s)),
        noun="environment", flags=("--from", "--to"), either_way=True,
        advice="; compare environments whose verdicts differ",
    )  # fmt: skip
    start_v, end_v = prober(first, 1), prober(last, 1)
    assert start_v is not None and end_v is not None  # check_ends refuses otherwise
    said: dict[str, Any] = {"start_verdict": start_v.value, "end_verdict": end_v.value}

    def flips(subset: list[str]) -> bool | None:
        verdict = prober(steps.applied(subset), 1)
        return None if verdict is None else verdict is end_v

    culprit = ddmin(steps.changes, flips) if len(steps.changes) > 1 else list(steps.changes)
    said["culprit"] = [change_text(n, steps.start, steps.end) for n in culprit]
    # 1-minimal only where each smaller set was measured: a skip hides what it would say
    untested = [
        c for c in culprit if len(culprit) > 1 and flips([x for x in culprit if x != c]) is None
    ]
    noisy = _confirm(prober, first, steps.applied(culprit), start_v, end_v, confirm)
    if noisy:
        said.update(status="flaky", flaky=noisy)
        return said
    if untested:
        tried: list[str] = []
        split = None if index is None else _split(prober, steps, culprit, index, confirm, tried)
        said.update(split or {"status": "ambiguous", "candidates": culprit}, split_tries=tried)
        return said
    said.update(status="found", candidates=culprit)
    if len(culprit) != 1:
        return said
    [package] = culprit
    said["package"] = package
    good, bad = steps.start.get(package, ""), steps.end.get(package, "")
    said.update(good=good or None, bad=bad or None)
    if good and bad and index is not None:
        said.update(_releases(prober, steps, package, good, bad, index, confirm))
    return said


def _split(
    prober: Prober[Step],
    steps: Steps,
    group: list[str],
    index: PackageIndex,
    confirm: int,
    tried: list[str],
) -> dict[str, Any] | None:
    """Packages that flip the verdict only together, told apart by their releases: each in
    turn (fewest releases between the ends first) bisected from its first end's version to
    its second's, pre-releases in, the others floated between their ends' versions. A
    package is named when its edge is its alone (the others, and every package both sides
    install, resolved alike on both sides) and every other package's edge moved it too; two
    edges of their own are an interaction, and a try that could not finish leaves the
    question open. What each try found goes to `tried`; None when the packages are not told
    apart."""
    if any(not steps.start.get(n) or not steps.end.get(n) for n in group):
        return None  # a package one end lacks has no releases to walk
    versions_of = prober.probes.versions
    if versions_of is None:
        return None  # nothing says what the others resolved to
    ranges: dict[str, list[str]] = {}
    for package in group:
        good, bad = steps.start[package], steps.end[package]
        try:
            ranges[package] = release_range(index, package, good, bad, prereleases=True)
        except (BadInput, InvalidVersion):
            tried.append(f"{package}: its releases between the ends are not on the index")
            continue
        if Version(good) > Version(bad):
            ranges[package].reverse()
    own: list[dict[str, Any]] = []
    moved_with: list[set[str]] = []  # per try whose edge moved others: the packages it moved
    for package in sorted(ranges, key=lambda n: (len(ranges[n]), n)):
        versions, others = ranges[package], [n for n in group if n != package]
        step_of = {v: steps.floated(package, v, others) for v in versions}
        try:  # the search's items are the versions, so that what it says names them
            with answering():
                result = bisect(versions, _by_version(prober, step_of), confirm=confirm)
        except (BisectError, ProbeFailed) as exc:
            tried.append(f"{package}: {str(exc).split(';')[0]}")
            continue
        if result.status != "found":
            tried.append(f"{package}: {result.status} between {', '.join(result.candidates)}")
            continue
        last, first = result.last_start, result.first_end
        before, after = versions_of(step_of[last]), versions_of(step_of[first])
        # the others, and any package both sides install (a dependency the release adds or
        # drops is its own change): what moved with the edge
        both = (before.keys() & after.keys()) - {package}
        moved = sorted({n for n in [*others, *both] if before.get(n) != after.get(n)})
        if moved:
            changes = ", ".join(change_text(n, before, after) for n in moved)
            tried.append(f"{package}: its edge {last} -> {first} moved {changes} too")
            moved_with.append(set(moved))
            continue
        held = ", ".join(f"{n} at {before.get(n)}" for n in others)
        tried.append(f"{package}: its edge {last} -> {first} with {held} on both sides")
        own.append({
            "status": "found", "candidates": [first], "package": package,
            "good": steps.start[package], "bad": steps.end[package], "versions": versions,
            "last_start": last, "first": first,
            "held": {n: before.get(n, "") for n in others},
        })  # fmt: skip
    if len(own) != 1 or len(moved_with) != len(group) - 1:
        return None  # no edge of its own, two (an interaction), or a try left unfinished
    [found] = own
    if not all(found["package"] in moved for moved in moved_with):
        return None
    return found


def _by_version(
    prober: Prober[Step], step_of: Mapping[str, Step]
) -> Callable[[str, int], Verdict | None]:
    """A probe of one package's releases, each its step."""
    return lambda version, attempt: prober(step_of[version], attempt)


def _confirm(
    prober: Prober[Step], first: Step, culprit: Step, start_v: Verdict, end_v: Verdict, k: int
) -> list[str]:
    """The first end and the culprit's set, each launched `k` more times: those that
    disagree with their first verdict (the outcome is noisy: no culprit claimed)."""
    noisy = []
    for step, wanted in ((first, start_v), (culprit, end_v)):
        for attempt in range(2, k + 2):
            verdict = prober(step, attempt)
            if verdict is not None and verdict is not wanted:
                noisy.append(prober.describe(step))
                break
    return noisy


def _releases(
    prober: Prober[Step],
    steps: Steps,
    package: str,
    good: str,
    bad: str,
    index: PackageIndex,
    confirm: int,
) -> dict[str, Any]:
    """The culprit's releases from its version at the first end to the second's, the other
    pins held at the first end: the first that gives the second end's verdict."""
    try:
        versions = release_range(index, package, good, bad)
    except (BadInput, InvalidVersion) as exc:
        del exc  # a version the index does not list (a local build): no release search
        return {"status": "ambiguous", "first": None, "candidates": [bad]}
    if Version(good) > Version(bad):
        versions.reverse()  # from the first end's version to the second's
    items = [steps.at(package, v) for v in versions]
    with answering():
        result = bisect(items, prober, confirm=confirm)
    contradictions, verified = checks.verify_sides(
        prober, items, result, checks.default_verify(len(items))
    )
    version_of = dict(zip(items, versions, strict=True))
    said: dict[str, Any] = {
        "versions": versions,
        "last_start": version_of[result.last_start],
        "first": version_of[result.first_end],
        "candidates": [version_of[c] for c in result.candidates],
        "verified": [prober.describe(i) for i in items if prober.describe(i) in verified],
    }
    if result.status == "flaky":
        said.update(status="flaky", first=None, flaky=[version_of[i] for i in result.flaky])
    elif contradictions:
        said.update(status="non-monotone", first=None, contradictions=contradictions)
    elif result.status == "ambiguous":
        said.update(status="ambiguous", first=None)
    return said


def answer_line(
    summary: BisectSummary, variant: str, next_step: Callable[[str, str, str], str] | None
) -> str:
    """The one line: the culprit and what it assumed, or why none is claimed."""
    details = summary.details
    if not isinstance(details, AttributionDetails):
        raise TypeError(f"an attribution's answer line from a {summary.kind} summary")
    flip = f"{variant} from {summary.start_verdict} to {summary.end_verdict}"
    n = len(details.changes)
    differ = f"{n} package{'s' * (n != 1)} differ{'s' * (n == 1)} between the ends"
    cost = f"{summary.runs} probe{'s' * (summary.runs != 1)}"
    tail = f"{differ}; {cost}; {ASSUMPTION}"
    if summary.status == "flaky":
        return (
            f"flaky: {', '.join(summary.flaky)} gave another verdict when launched again, so the "
            f"outcome is noisy and no culprit is claimed ({tail}); {checks.NOISE_ADVICE}"
        )
    if summary.status == "non-monotone":
        items = ", ".join(f"{c.item} {c.verdict.value}" for c in summary.contradictions)
        return (
            f"non-monotone: {summary.package}'s releases change {variant}'s verdict more than "
            f"once ({items}); no release claimed ({tail})"
        )
    if summary.package is None:
        names = " together with ".join(details.culprit)
        if summary.status == "ambiguous":
            tries = "".join(f"; {t}" for t in details.split_tries)
            return (
                f"culprit among: {names} (their changes together flip {flip}; a smaller set "
                f"could not be installed to test{tries}; {tail})"
            )
        return f"culprit: {names} (only their changes together flip {flip}; {tail})"
    change = details.culprit[0]
    if details.good is None or details.bad is None:  # added or removed
        return f"culprit: {change} (this change flips {flip}; {tail})"
    package, good, bad = details.package, details.good, details.bad
    if package is None:  # one change named, but no package to it: say the change
        return f"culprit: {change} (this change flips {flip}; {tail})"
    if summary.first is None:
        listed = ", ".join(summary.candidates)
        return (
            f"culprit: {package} (its change from {good} to {bad} flips {flip}; its first "
            f"release to do so is one of: {listed}; {tail})"
        )
    after = next_step(package, summary.last_start or good, summary.first) if next_step else ""
    if details.held:
        held = ", ".join(f"{n} at {v}" for n, v in sorted(details.held.items()))
        moved = " and ".join(details.culprit)
        return (
            f"culprit: {package} {summary.first} (its release flips {flip} with {held} on both "
            f"sides of it; {moved} could only be installed together; {tail}){after}"
        )
    return (
        f"culprit: {package} {summary.first} (its change from {good} to {bad} flips {flip}; "
        f"{tail}){after}"
    )
