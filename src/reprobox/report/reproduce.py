"""The paste-able reproduction block: every variant runs on its own pins.

Installing one variant's pins on top of another's leaves the environment holding whichever
was installed last, so a control listed after the broken variant would run on the broken
release. Each distinct pin set gets its own fresh venv instead; variants sharing pins share
it. On CPU, torch comes from the PyTorch CPU index (`+cpu` sorts above PyPI's build of the
same version), so a maintainer does not pull the multi-GB CUDA wheel.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def _name(pin: str) -> str:
    try:
        return canonicalize_name(Requirement(pin).name)
    except InvalidRequirement:
        return ""


def install_lines(
    pins: Sequence[str], platform: str = "cpu", late: Sequence[str] = ()
) -> list[str]:
    """`pip install PINS` (the CPU torch index on CPU when torch is pinned), then the pins
    whose source build imports the rest (deepspeed's setup imports torch) with
    `--no-build-isolation`, as the harness installs them."""
    later = {canonicalize_name(n) for n in late}
    first = [p for p in pins if _name(p) not in later]
    last = [p for p in pins if _name(p) in later]
    cpu_torch = platform == "cpu" and "torch" in {_name(p) for p in pins}
    index = ["--extra-index-url", CPU_TORCH_INDEX] if cpu_torch else []
    lines = [shlex.join(["pip", "install", *index, *first])] if first else []
    if last:
        lines.append(shlex.join(["pip", "install", "--no-build-isolation", *last]))
    return lines


def install_line(pins: Sequence[str], platform: str = "cpu") -> str:
    """One `pip install` line of `pins` (no package built against the others)."""
    return install_lines(pins, platform)[0]


def pin_groups(
    variants: Sequence[str],
    pins: Callable[[str], list[str]],
    line: Callable[[str], str],
    expect: Callable[[str], str],
    platform: str = "cpu",
    late: Sequence[str] = (),
) -> list[str]:
    """Shell lines: per distinct pin set (in the order variants first name it), a fresh venv,
    its install line, then each of its variants' launcher lines with the expected verdict."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for variant in variants:
        groups.setdefault(tuple(pins(variant)), []).append(variant)
    lines: list[str] = []
    for number, (pinset, members) in enumerate(groups.items(), start=1):
        env = f"env{number}" if len(groups) > 1 else "env"
        if lines:
            lines += ["deactivate", ""]
        lines.append(f"# {', '.join(members)}")
        lines.append(f"python3 -m venv {env} && . {env}/bin/activate")
        lines += install_lines(pinset, platform, late)
        for variant in members:
            lines.append(f"{line(variant)}   # expect: {expect(variant)}")
    return lines
