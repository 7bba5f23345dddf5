"""Locks and environments, what every back end installs: the lock of a cell (committed, or
resolved into the cache for overrides and other torch sources), the git sources it names,
and the venv made from it. The pipeline picks the lock; a back end makes its environment.
"""

from __future__ import annotations

from pathlib import Path

from packaging.specifiers import SpecifierSet

from reprobox.core.cells import is_source
from reprobox.core.errors import BadInput
from reprobox.core.settings import Settings
from reprobox.core.spec import Repro, merge_pins
from reprobox.envs import git, locks, venvs
from reprobox.run import phases


def lock_path(repro: Repro, variant: str, platform: str) -> Path:
    """The committed lock of a variant (what the image installs, too)."""
    return repro.dir / "locks" / f"{variant}.{platform}.txt"


def lock_request(
    repro: Repro, variant: str, platform: str = "cpu", overrides: dict[str, str] | None = None
) -> locks.LockRequest:
    """What a variant's lock is made from. An override is a version (`name==v`) or a built
    wheel (`name @ file:///...whl`, see `resolve_sources`)."""
    versions = {k: v for k, v in (overrides or {}).items() if not is_source(v)}
    wheels = [f"{k} @ {v}" for k, v in (overrides or {}).items() if is_source(v)]
    cutoff = repro.spec.env.exclude_newer
    return locks.LockRequest(
        requirements=tuple(merge_pins(repro.requirements(variant, platform, versions), wheels)),
        python=repro.python(platform),
        platform=platform,
        exclude_newer=cutoff,
        # a release asked for by name is installable whatever its upload date: the cut-off
        # freezes what the repro leaves unpinned (the canary asks for the newest release)
        exclude_newer_packages=tuple((k, locks.NO_CUTOFF) for k in sorted(versions) if cutoff),
    )


def lock_for(
    repro: Repro,
    variant: str,
    platform: str = "cpu",
    overrides: dict[str, str] | None = None,
    *,
    settings: Settings,
) -> Path:
    """The committed lock when the variant runs at its own pins (in the CPU build of torch),
    else a cached one (also the pypi flavour of torch, REPROBOX_TORCH_SOURCE=pypi)."""
    if settings.torch_source == "host":
        host_range(repro, platform)  # none stated: bad input, before anything is installed
    overrides, _ = resolve_sources(overrides, settings)
    request = lock_request(repro, variant, platform, overrides)
    committed = lock_path(repro, variant, platform)
    own_pins = not overrides and settings.torch_source != "pypi"
    if own_pins and committed.is_file():
        shown = str(committed.relative_to(repro.dir.parent.parent))
        if locks.lock_input_hash(committed) != request.input_hash:
            raise BadInput(
                f"{shown} is stale: repro.toml changed "
                f"since it was generated; run `nox -s lock -- {repro.name}`"
            )
        locks.check_body(committed, shown)  # edited with its header kept: integrity error
        return committed
    return locks.cached_lock(request, settings)


def host_range(repro: Repro, platform: str) -> SpecifierSet:
    """The host torch versions the repro accepts on `platform` ([platforms.NAME] host_torch),
    which REPROBOX_TORCH_SOURCE=host needs: a repro that states none was never said to work
    with any torch but its own (bad input, exit 2)."""
    wanted = repro.platform(platform).host_torch_range
    if wanted is None:
        raise BadInput(
            f"REPROBOX_TORCH_SOURCE=host: {repro.name} states no host_torch range for platform "
            f'{platform} (add host_torch = ">=X.Y" under [platforms.{platform}] in repro.toml)'
        )
    return wanted


def resolve_sources(
    overrides: dict[str, str] | None, settings: Settings
) -> tuple[dict[str, str], dict[str, str]]:
    """Overrides with each git ref or checkout replaced by the wheel built from it, and
    package -> the commit that wheel holds (what the record names). A branch resolves once
    per process, a sha never moves; a ref that does not exist is bad input (exit 2), a
    commit that does not build an environment failure (exit 3)."""
    resolved: dict[str, str] = {}
    commits: dict[str, str] = {}
    for package, value in (overrides or {}).items():
        if not is_source(value) or value.endswith(".whl"):
            resolved[package] = value
            continue
        source = git.resolve_source(package, value, settings)
        resolved[package] = source.requirement.split(" @ ", 1)[1]
        commits[package] = source.commit
    return resolved, commits


def env_inputs(repro: Repro, platform: str) -> tuple[str, dict[str, str], list[str]]:
    """What besides the lock makes an environment: python, install env, late source builds."""
    return repro.python(platform), repro.install_env(platform), repro.spec.env.no_build_isolation


def ensure_env(repro: Repro, lock: Path, platform: str, *, settings: Settings) -> venvs.Env:
    """The repro's environment for `lock` on `platform`, created if needed (an install is
    said as a phase: it is the long silent step of a first run)."""
    host_packages = list(repro.platform(platform).host_package_ranges)
    if settings.torch_source != "host":  # a host venv's lock is made from the host first
        path = settings.cache / "envs" / venvs.env_hash(lock, *env_inputs(repro, platform))
        if venvs.ready_problem(path, lock) is not None:
            count = len(venvs.lock_pins(lock.read_text()))
            phases.emit(phases.PhaseKind.INSTALLING, f"{count} package{'s' * (count != 1)}")
    return venvs.ensure_env(
        lock, *env_inputs(repro, platform), settings=settings, host_packages=host_packages
    )
