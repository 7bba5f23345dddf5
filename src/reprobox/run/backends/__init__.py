"""Back ends: where a launch runs (see run/backend.py for the interface). Every kind is named
and built by the one registry (registry.py); callers name a kind, never a class."""

from __future__ import annotations

from reprobox.run.backends.registry import (
    NAMES,
    BackendFlags,
    ContainerFlags,
    SlurmFlags,
    make_backend,
)

__all__ = ["NAMES", "BackendFlags", "ContainerFlags", "SlurmFlags", "make_backend"]
