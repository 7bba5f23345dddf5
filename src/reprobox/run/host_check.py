"""The host's torch, checked before launching (REPROBOX_TORCH_SOURCE=host): the version the
cell's environment imports against the repro's `host_torch` range, and each `host_packages`
entry against its own. A development build (`2.6.0a0+git...`, as NGC images ship) counts as
its release: a range would otherwise refuse every such build silently.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from reprobox.core.errors import BadInput
from reprobox.core.spec import Repro
from reprobox.run.backend import Prepared
from reprobox.run.installs import host_range

HOST_RESULT_BY = "reprobox: the host's torch, checked before launching"


def check(repro: Repro, platform: str, prepared: Prepared) -> tuple[dict[str, str], str | None]:
    """(what the record keeps of the host's torch, why the cell cannot be tested here or
    None). A repro with no host_torch range, or a back end that does not run the host's
    torch, is bad input (exit 2)."""
    wanted = host_range(repro, platform)
    host = prepared.handle.host_torch
    if host is None:
        raise BadInput(
            f"REPROBOX_TORCH_SOURCE=host: the {prepared.runner} back end does not run "
            "with the host's torch; use the venv (or slurm) back end"
        )
    record = host.record(repro.python(platform))
    host_lock = prepared.handle.host_lock
    if host_lock is not None:  # what was installed: `lock` is what it was derived from
        record["lock"] = str(host_lock)
    where = f"{repro.name} accepts on platform {platform}"
    problem = _outside("torch", host.version, wanted, where)
    found = {name: version for name, version, _ in host.packages}
    for name, wanted_range in repro.platform(platform).host_package_ranges.items():
        if problem is not None:
            break
        if name in host.missing:
            section = f"[platforms.{platform}] host_packages"
            problem = f"the host has no {name}, which {repro.name}'s {section} takes from it"
        else:
            problem = _outside(name, found[name], wanted_range, where)
    return record, problem


def _outside(name: str, version: str, wanted: SpecifierSet, where: str) -> str | None:
    """Why the host's `name` `version` is not in `wanted`, or None. A development build
    (`2.6.0a0+git...`) counts as its release."""
    try:
        if wanted.contains(Version(version), prereleases=True):
            return None
        why = f"is outside the range {where}"
    except InvalidVersion:
        why = "is not a version the range can be checked against"
    field = "host_torch" if name == "torch" else f"host_packages.{name}"
    return f"the host's {name} {version} {why} ({field} = {wanted!s})"
