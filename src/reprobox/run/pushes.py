"""Where each variant's image was pushed, and the digest the registry gave it.

`nox -s image -- REPRO --variant V --push REGISTRY` pushes the content-addressed local image
(`localhost/reprobox/<repro>:<variant>-<platform>-<hash>`, run/backends/container.py) and
appends one record here; `reprobox k8s` reads them to reference each cell's image by digest
(`REGISTRY/<repro>@sha256:...`), never by a tag that can move. The records live in the
results folder (`<results>/<repro>/_images/pushed.json`): what was pushed from this machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ValidationError, field_validator

from reprobox.core.errors import BadInput
from reprobox.core.files import atomic_write

PUSH_FILE = "pushed.json"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# A local OCI layout (podman only): a real push of the same bytes, to carry to a registry.
LAYOUT_PREFIX = "oci:"


class Pushed(BaseModel):
    """One push of one image: what went (the local content-addressed tag) and where."""

    repro: str
    variant: str
    platform: str
    local_tag: str  # localhost/reprobox/<repro>:<variant>-<platform>-<hash>
    lock_sha256: str
    registry: str  # as given to --push
    reference: str  # REGISTRY/<repro>@sha256:... (what a pod spec names)
    digest: str
    pushed_at: str  # UTC, ISO 8601
    engine: str

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not DIGEST.match(value):
            raise ValueError(f"not a sha256 digest: {value!r}")
        return value

    @property
    def in_registry(self) -> bool:
        """False for a local OCI layout, which a cluster cannot pull from."""
        return not self.registry.startswith(LAYOUT_PREFIX)


def push_file(results: Path, repro: str) -> Path:
    return results / repro / "_images" / PUSH_FILE


def load(results: Path, repro: str) -> list[Pushed]:
    """Every push recorded for `repro`, oldest first; a damaged file is an error naming it
    (an image reference must never be guessed)."""
    path = push_file(results, repro)
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise ValueError("not a list")
        return [Pushed.model_validate(row) for row in rows]
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise BadInput(f"{path}: not a push record ({first}); push again to rewrite it") from None


def add(results: Path, pushed: Pushed) -> Path:
    """Record a push; a later push of the same image to the same registry replaces it."""
    kept = [p for p in load(results, pushed.repro)
            if (p.local_tag, p.registry) != (pushed.local_tag, pushed.registry)]  # fmt: skip
    rows = [p.model_dump() for p in [*kept, pushed]]
    return atomic_write(push_file(results, pushed.repro), json.dumps(rows, indent=2))


def find(records: list[Pushed], local_tag: str, registry: str | None = None) -> Pushed | None:
    """The newest push of `local_tag` (to `registry` when given) that a cluster can pull."""
    found = [p for p in records if p.local_tag == local_tag and p.in_registry
             and (registry is None or p.registry.rstrip("/") == registry.rstrip("/"))]  # fmt: skip
    return max(found, key=lambda p: p.pushed_at) if found else None


def remote_name(registry: str, repro: str) -> str:
    """`REGISTRY/<repro>`: where the images of `repro` go in a registry."""
    registry = registry.strip().rstrip("/")
    if not registry or any(c.isspace() for c in registry) or "@" in registry:
        raise BadInput(f"--push {registry!r}: want a registry path such as ghcr.io/org/reprobox")
    if "://" in registry:
        raise BadInput(f"--push {registry}: give the registry without a scheme (no https://)")
    return f"{registry}/{repro}"
