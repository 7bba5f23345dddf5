"""Which entries of a lock the host's torch brings (REPROBOX_TORCH_SOURCE=host): a rule on a
lock's text alone, shared by the host flavour of a lock (`locks.host_lock`) and by the
wheelhouse (`wheelhouse.wanted_entries`), so neither imports the other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from packaging.utils import canonicalize_name

# What the host's torch brings itself: torch, its compiler and every CUDA runtime wheel it
# requires (torch < 2.9: nvidia-*-cu12; 2.9 and later: nvidia-*-cu13 / unsuffixed, and the
# cuda-toolkit, cuda-bindings and cuda-pathfinder wheels). Two torches' CUDA libraries side
# by side would be loaded by whichever comes first on the path.
HOST_PROVIDED = frozenset(
    {"torch", "triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"}
    | {"cuda-toolkit", "cuda-bindings", "cuda-pathfinder", "cuda-python"}
)
# nvidia-* that are no part of torch: a library's own dependency (DeepSpeed's NVML binding).
NOT_HOST_PROVIDED = frozenset({"nvidia-ml-py", "nvidia-ml-py3"})


def host_provided(name: str) -> bool:
    """Whether the host's torch brings distribution `name` (so the host flavour drops it)."""
    key = canonicalize_name(name)
    if key in NOT_HOST_PROVIDED:
        return False
    return key in HOST_PROVIDED or key.startswith("nvidia-")


def without_host_torch(text: str, also: Iterable[str] = ()) -> tuple[str, list[str]]:
    """A lock's text without the entries the host's torch provides (an entry is its line and
    the indented hash and `# via` lines under it), and the names dropped: torch's family
    (`host_provided`), then whatever the lock holds only for dropped entries (its `# via`
    lines name no one else: sympy, networkx, jinja2 for torch), which the host's torch brings
    beside it; and the packages `also` names (a platform's `host_packages`), likewise. A pin
    with no `# via` is the repro's own and stays unless `also` names it."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]  # (name, lines); header first
    for line in text.splitlines(keepends=True):
        if line[:1] not in ("", " ", "\t", "#", "\n"):
            name = str(canonicalize_name(re.split(r"[=<>!~ ;@\[]", line, maxsplit=1)[0]))
            blocks.append((name, []))
        blocks[-1][1].append(line)
    needed_by = {name: _via(lines) for name, lines in blocks if name is not None}
    given = {str(canonicalize_name(name)) for name in also}
    dropped = {name for name in needed_by if host_provided(name) or name in given}
    while more := {
        name for name, via in needed_by.items()
        if name not in dropped and via and via <= dropped
    }:  # fmt: skip
        dropped |= more
    kept = "".join("".join(lines) for name, lines in blocks if name not in dropped)
    return kept, [name for name, _ in blocks if name in dropped]


def _via(lines: list[str]) -> set[str]:
    """The names an entry's `# via` comment lists (`# via a` or `# via` then `#   a` lines;
    `-r file` and `-c file` inputs count as the repro's own)."""
    names: set[str] = set()
    inside = False
    for line in lines[1:]:
        comment = line.strip()
        if not comment.startswith("#"):
            continue
        body = comment.lstrip("#").strip()
        if body.startswith("via"):
            inside, body = True, body[3:].strip()
        if inside and body:
            names.add("-" if body.startswith("-") else str(canonicalize_name(body.split()[0])))
    return names
