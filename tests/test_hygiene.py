"""Nothing machine-specific in the repository: no local wheel folder, home or checkout path."""

from __future__ import annotations

import subprocess
from pathlib import Path

from reprobox.core.settings import Settings
from reprobox.envs.torch_source import find_links


def test_no_path_of_this_machine_is_committed(root: Path) -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    needles = [*find_links(Settings.from_env()), str(Path.home()) + "/", str(root) + "/"]
    planted = {"tests/test_scrub.py"}  # plants home paths on purpose, to see them scrubbed
    for name in tracked:
        if name in planted:
            continue
        path = root / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for needle in needles:
            assert needle not in text, f"{name} contains {needle}"
