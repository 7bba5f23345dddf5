"""Date bisection names the right UTC day, whatever the host's time zone.

A fake index holds accelerate 0.24.0 uploaded late on 2023-10-24 (23:30 UTC: already the 25th
in Tokyo). Fake probes resolve each day's lock request the way uv 0.13.9 does (measured: a
bare date is the end of that day in the host's zone; an instant is exact), so a bisect that
passed bare dates would name the day before in UTC and another day under another zone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock
from pathlib import Path

import pytest
from bisect_fakes import C, FakeIndex, R, hist_target
from packaging.version import Version

from fakes import repro_toml, write_repro
from reprobox.bisect.dates import (
    ChangeSet,
    DateItem,
    as_of_request,
    cutoff,
    date_bisect,
    released_on,
)
from reprobox.bisect.prober import Outcome, Probes
from reprobox.bisect.summary import DateDetails
from reprobox.core import spec
from reprobox.envs import locks
from reprobox.envs.index import Release
from reprobox.run.installs import lock_request

ACCELERATE = [
    Release(Version("0.23.0"), uploaded=datetime(2023, 9, 22, 10, 0, tzinfo=UTC)),
    Release(Version("0.24.0"), uploaded=datetime(2023, 10, 24, 23, 30, tzinfo=UTC)),
    Release(Version("0.24.1"), uploaded=datetime(2023, 10, 30, 12, 0, tzinfo=UTC)),
]
INDEX = FakeIndex({"accelerate": ACCELERATE, "numpy": [], "transformers": []})


def uv_cutoff(text: str) -> datetime:
    """What uv 0.13.9 makes of an --exclude-newer-package value."""
    if len(text) == 10:  # a bare date: the end of that day in the host's time zone
        return datetime.combine(date.fromisoformat(text) + timedelta(days=1), clock()).astimezone()
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def resolve(request: locks.LockRequest) -> str:
    """The accelerate version uv would pick for `request` (the newest not excluded)."""
    pins = dict(r.split("==") for r in request.requirements if "==" in r)
    if "accelerate" in pins:
        return pins["accelerate"]
    limit = uv_cutoff(dict(request.exclude_newer_packages)["accelerate"])
    allowed = [r for r in ACCELERATE if r.uploaded is not None and r.uploaded < limit]
    return str(max(allowed, key=lambda r: r.version).version)


@dataclass
class FakeUv:
    """Probes that resolve as uv would and reproduce from accelerate 0.24.0 on."""

    request_of: Callable[[DateItem], locks.LockRequest]
    runs: list[str] = field(default_factory=list)

    def versions(self, item: DateItem) -> dict[str, str]:
        return {"accelerate": resolve(self.request_of(item)), "numpy": "1.26.0"}

    def run(self, item: DateItem, attempt: int) -> Outcome:
        version = self.versions(item)["accelerate"]
        self.runs.append(version)
        return Outcome("verdict", R if Version(version) >= Version("0.24.0") else C)

    def env_key(self, item: DateItem) -> str:
        return str(sorted(self.versions(item).items()))  # days alike share one environment


@pytest.fixture(params=["UTC", "Asia/Tokyo"])
def host_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    yield request.param
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_the_day_is_the_utc_day_of_the_upload(tmp_path: Path, host_zone: str) -> None:
    fakes: list[FakeUv] = []

    def probes_for(request_of: Callable[[DateItem], locks.LockRequest]) -> Probes[DateItem]:
        fakes.append(FakeUv(request_of))
        uv = fakes[-1]
        return Probes(run=uv.run, env_key=uv.env_key, versions=uv.versions)

    summary = date_bisect(
        hist_target(tmp_path), date(2023, 10, 1), date(2023, 11, 10), ["accelerate"],
        index=INDEX, probes_for=probes_for,
    )  # fmt: skip
    assert summary.status == "found", summary.result
    assert summary.first == "2023-10-24" and summary.last_start == "2023-10-23"
    assert isinstance(summary.details, DateDetails)
    assert summary.details.released_on_day == ["accelerate 0.24.0 at 2023-10-24 23:30 UTC"]
    assert summary.result.startswith(
        "first reproducing date: 2023-10-24 (UTC; new that day: accelerate 0.24.0 at "
        "2023-10-24 23:30 UTC; assuming one change between 2023-10-01 and 2023-11-10; "
    )
    assert summary.result.endswith("; culprit: accelerate 0.23.0 -> 0.24.0")
    # the lock of each day is keyed on its exact cutoff
    request_of = fakes[0].request_of
    day = request_of(date(2023, 10, 24))
    assert day.exclude_newer_packages == (("accelerate", "2023-10-25T00:00:00Z"),)
    assert "accelerate" in day.requirements  # floated: unpinned
    assert request_of(date(2023, 10, 23)).input_hash != day.input_hash
    bare = locks.LockRequest(
        **{**day.__dict__, "exclude_newer_packages": (("accelerate", "2023-10-25"),)}
    )
    assert bare.input_hash != day.input_hash
    pinned = request_of(ChangeSet(("accelerate",), (("accelerate", "0.24.0"),)))
    assert pinned.requirements == ("accelerate==0.24.0",) and not pinned.exclude_newer_packages


def test_cutoffs_and_uploads_are_utc_instants(host_zone: str) -> None:
    assert cutoff(date(2023, 10, 24)) == "2023-10-25T00:00:00Z"
    assert cutoff(date(2023, 12, 31)) == "2024-01-01T00:00:00Z"
    assert released_on(INDEX, ["accelerate"], date(2023, 10, 24)) == [
        "accelerate 0.24.0 at 2023-10-24 23:30 UTC"
    ]
    assert released_on(INDEX, ["accelerate"], date(2023, 10, 25)) == []
    naive = FakeIndex({"trl": [Release(Version("0.7.2"), uploaded=datetime(2023, 10, 12, 13, 9))]})
    assert released_on(naive, ["trl"], date(2023, 10, 12)) == ["trl 0.7.2 at 2023-10-12 13:09 UTC"]


def test_a_release_asked_for_by_name_passes_the_repros_cutoff(scratch_root: Path) -> None:
    """`--with transformers==V` (the canary's newest release) resolves even when V was
    uploaded after `[env] exclude_newer`, which freezes only what the repro leaves unpinned;
    the committed locks' requests (no override) are unchanged, and a date bisect's floated
    packages keep their own day beside it."""
    toml = repro_toml(title="t", pins=("torch==2.13.0", "flagpkg==1.2.0"))
    toml = toml.replace("[env]\n", '[env]\nexclude_newer = "2026-11-29"\n', 1)
    write_repro(scratch_root, "case", toml)
    repro = spec.load(scratch_root, "case")
    plain = lock_request(repro, "broken", "cpu")
    assert plain.exclude_newer == "2026-11-29" and plain.exclude_newer_packages == ()
    asked = lock_request(repro, "broken", "cpu", {"flagpkg": "9.0.0"})
    assert asked.exclude_newer_packages == (("flagpkg", locks.NO_CUTOFF),)
    assert "flagpkg==9.0.0" in asked.requirements and asked.input_hash != plain.input_hash
    day = as_of_request(asked, {"torch"}, date(2026, 1, 5))
    assert dict(day.exclude_newer_packages) == {
        "flagpkg": locks.NO_CUTOFF, "torch": cutoff(date(2026, 1, 5))
    }  # fmt: skip
