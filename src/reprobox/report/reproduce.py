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

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def _names_torch(pins: Sequence[str]) -> bool:
    for pin in pins:
        try:
            if Requirement(pin).name.lower() == "torch":
                return True
        except InvalidRequirement:
            continue
    return False


def install_line(pins: Sequence[str], platform: str = "cpu") -> str:
    """`pip install PINS`, with the CPU torch index on CPU when torch is pinned."""
    index = (
        ["--extra-index-url", CPU_TORCH_INDEX] if platform == "cpu" and _names_torch(pins) else []
    )
    return shlex.join(["pip", "install", *index, *pins])


def pin_groups(
    variants: Sequence[str],
    pins: Callable[[str], list[str]],
    line: Callable[[str], str],
    expect: Callable[[str], str],
    platform: str = "cpu",
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
        lines.append(install_line(pinset, platform))
        for variant in members:
            lines.append(f"{line(variant)}   # expect: {expect(variant)}")
    return lines
