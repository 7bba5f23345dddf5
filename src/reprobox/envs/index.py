"""Release lists of packages: an abstract index, the real one, and version selection.

As in pip-tools, resolution logic talks to a `PackageIndex` protocol; `SimpleIndex` reads the
index's PEP 691 JSON pages (with yanked flags and upload times, which `pip index` does not
give), and tests use a fake. Pages are cached on disk for a day, so listing nox sessions
does not hit the network each time.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

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
from reprobox.core.settings import cache_dir
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

    def __init__(self, url: str | None = None, cache: Path | None = None) -> None:
        self._url = url
        self.cache = cache or cache_dir() / "index"

    @property
    def url(self) -> str:
        return self._url or index_url()

    def releases(self, package: str) -> list[Release]:
        name = canonicalize_name(package)
        page = self._page(name)
        return releases_from_page(name, page)

    def _page(self, name: str) -> dict:
        cached = self.cache / f"{name}.json"
        fresh = cached.is_file() and time.time() - cached.stat().st_mtime < CACHE_TTL_S
        if fresh and not os.environ.get("REPROBOX_REFRESH_INDEX"):
            return json.loads(cached.read_text())
        request = urllib.request.Request(f"{self.url}/{name}/", headers={"Accept": ACCEPT})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                page = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise BadInput(f"no package {name!r} on the index") from None
            raise EnvError(f"index answered {exc.code} for {name!r}") from None
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            if cached.is_file():
                return json.loads(cached.read_text())  # stale beats nothing when offline
            raise EnvError(f"cannot read the release list of {name!r}: {exc}") from None
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps(page))
        tmp.replace(cached)
        return page


def releases_from_page(name: str, page: dict) -> list[Release]:
    """Group a PEP 691 page's files by version; a release is yanked when all its files are."""
    files: dict[Version, list[dict]] = {}
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
    try:
        spec = SpecifierSet(specifier)
    except InvalidSpecifier:
        raise BadInput(f"{specifier!r} is not a version range") from None
    excluded = {Version(v) for v in exclude}
    chosen = [
        r.version
        for r in releases
        if (include_yanked or not r.yanked)
        and r.version not in excluded
        and spec.contains(r.version, prereleases=prereleases)
    ]
    return sorted(chosen)


def versions_in_range(
    package: str, specifier: str, prereleases: bool = False, include_yanked: bool = False
) -> list[str]:
    """`select` over the default index's releases, as strings (a matrix axis)."""
    found = select(SimpleIndex().releases(package), specifier, prereleases, include_yanked)
    return [str(v) for v in found]
