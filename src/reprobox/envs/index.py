"""Release lists of packages: an abstract index, the real one, and version selection.

As in pip-tools, resolution logic talks to a `PackageIndex` protocol; `SimpleIndex` reads the
index's PEP 691 JSON pages (with yanked flags and upload times, which `pip index` does not
give), and tests use a fake. Pages are cached on disk for a day, so listing nox sessions
does not hit the network each time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from reprobox.core.errors import BadInput, EnvError
from reprobox.core.files import atomic_write
from reprobox.core.settings import Settings
from reprobox.envs.uv import index_url

CACHE_TTL_S = 24 * 3600
ACCEPT = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class Release:
    version: Version
    yanked: bool = False
    uploaded: datetime | None = None  # the earliest file's upload time


class PackageIndex(Protocol):
    def releases(self, package: str) -> list[Release]:
        """Every release of `package`, in any order; BadInput if the package is unknown."""
        ...


class SimpleIndex:
    """The default package index, read through its JSON Simple API (PEP 691)."""

    def __init__(self, cache: Path, *, url: str | None = None, refresh: bool = False) -> None:
        self._url = url
        self.cache = cache
        self.refresh = refresh  # re-read pages younger than a day (REPROBOX_REFRESH_INDEX)

    @classmethod
    def from_settings(cls, settings: Settings) -> SimpleIndex:
        return cls(settings.cache / "index", refresh=settings.refresh_index)

    @property
    def url(self) -> str:
        return self._url or index_url()

    def releases(self, package: str) -> list[Release]:
        name = canonicalize_name(package)
        page = self._page(name)
        return releases_from_page(name, page)

    def _page(self, name: str) -> dict[str, Any]:
        cached = self.cache / f"{name}.json"
        fresh = cached.is_file() and time.time() - cached.stat().st_mtime < CACHE_TTL_S
        if fresh and not self.refresh:
            return _object(json.loads(cached.read_text()))
        # start-up cost: the HTTP client (urllib, http.client, ssl: about 10 ms) loads when
        # a page is fetched, not on every `reprobox run` that builds an index it never reads
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.url}/{name}/", headers={"Accept": ACCEPT})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                page = _object(json.load(response))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise BadInput(f"no package {name!r} on the index") from None
            raise EnvError(f"index answered {exc.code} for {name!r}") from None
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            if cached.is_file():
                return _object(json.loads(cached.read_text()))  # stale beats nothing offline
            raise EnvError(f"cannot read the release list of {name!r}: {exc}") from None
        atomic_write(cached, json.dumps(page))
        return page


def _object(data: Any) -> dict[str, Any]:
    """A JSON page must be an object; anything else is a broken index (or cache file)."""
    if not isinstance(data, dict):
        raise EnvError(f"the index answered a JSON {type(data).__name__}, not a page")
    return data


def releases_from_page(name: str, page: dict[str, Any]) -> list[Release]:
    """Group a PEP 691 page's files by version; a release is yanked when all its files are."""
    files: dict[Version, list[dict[str, Any]]] = {}
    for entry in page.get("files", []):
        version = _file_version(entry.get("filename", ""))
        if version is not None:
            files.setdefault(version, []).append(entry)
    releases = []
    for version, entries in files.items():
        times = [_parse_time(e.get("upload-time")) for e in entries]
        known = [t for t in times if t is not None]
        releases.append(
            Release(
                version=version,
                yanked=all(bool(e.get("yanked")) for e in entries),
                uploaded=min(known) if known else None,
            )
        )
    return sorted(releases, key=lambda r: r.version)


def _file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        if filename.endswith((".tar.gz", ".zip")):
            return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def select(
    releases: Iterable[Release],
    specifier: str,
    prereleases: bool = False,
    include_yanked: bool = False,
    exclude: Iterable[str] = (),
) -> list[Version]:
    """Versions in `specifier`, oldest first, without yanked or pre-releases unless asked."""
    return select_explained(releases, specifier, prereleases, include_yanked, exclude).kept


@dataclass(frozen=True)
class Selection:
    """The versions a range kept, and those it matched but left out, each with the reason."""

    kept: list[Version]
    left_out: list[tuple[Version, str]]  # (version, "yanked" | "pre-release" | "excluded")

    def note(self, package: str) -> str:
        """One line for people ("" when nothing was left out)."""
        if not self.left_out:
            return ""
        listed = ", ".join(f"{v} ({why})" for v, why in self.left_out)
        return f"{package}: left out of the range: {listed}"


RANGE_FORMS = (
    "a specifier such as '>=4.44.2,<=4.49.0', or FIRST..LAST ('4.44.2..4.49.0', both ends in)"
)


def version_range(text: str) -> SpecifierSet:
    """A range of releases: a PEP 440 specifier, or `FIRST..LAST` (`>=FIRST,<=LAST`, the
    form `--by-date` takes); an error shows both forms. "" is every release."""
    first, dots, last = (part.strip() for part in text.partition(".."))
    try:
        if not dots:
            return SpecifierSet(text)
        if Version(first) > Version(last):
            raise BadInput(f"{text!r}: {first} comes after {last}; give FIRST..LAST")
        return SpecifierSet(f">={first},<={last}")
    except (InvalidSpecifier, InvalidVersion):
        raise BadInput(f"{text!r} is not a version range; give {RANGE_FORMS}") from None


def select_explained(
    releases: Iterable[Release],
    specifier: str,
    prereleases: bool = False,
    include_yanked: bool = False,
    exclude: Iterable[str] = (),
) -> Selection:
    """`select`, saying which releases inside the range it left out and why, so a matrix
    axis never drops a release silently (transformers 4.46.0 is yanked, for one)."""
    spec = version_range(specifier)
    excluded = {Version(v) for v in exclude}
    kept: list[Version] = []
    left_out: list[tuple[Version, str]] = []
    for release in sorted(releases, key=lambda r: r.version):
        version = release.version
        if not spec.contains(version, prereleases=True):
            continue
        if not spec.contains(version, prereleases=prereleases):
            left_out.append((version, "pre-release"))
        elif release.yanked and not include_yanked:
            left_out.append((version, "yanked"))
        elif version in excluded:
            left_out.append((version, "excluded"))
        else:
            kept.append(version)
    return Selection(kept=kept, left_out=left_out)


class IndexAxes:
    """Matrix range axes resolved against one index (the `VersionsInRange` that core.cells
    takes), remembering what each range left out so the caller can say so."""

    def __init__(self, index: PackageIndex) -> None:
        self.index = index
        self.left_out: dict[str, Selection] = {}

    def __call__(
        self, package: str, specifier: str, prereleases: bool = False, include_yanked: bool = False
    ) -> list[str]:
        found = select_explained(
            self.index.releases(package), specifier, prereleases, include_yanked
        )
        if found.left_out:
            self.left_out[package] = found
        return [str(v) for v in found.kept]

    def notes(self) -> list[str]:
        """One line per range that left releases out, e.g. `transformers: left out of the
        range: 4.46.0 (yanked)`."""
        return [found.note(package) for package, found in self.left_out.items()]
