"""The architecture as rules, checked like code: the import-linter contracts of pyproject
(layers; a pure core; report and scale-out never reach the run back ends; a pure search),
mypy (strict on core and bisect), and a thin noxfile."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

BIN = Path(sys.executable).parent


def test_import_contracts_hold() -> None:
    done = subprocess.run([BIN / "lint-imports"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_mypy_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_noxfile_knows_only_the_nox_view_and_the_spec() -> None:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reprobox"):
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names if a.name.startswith("reprobox")}
    assert imported <= {"reprobox.scaleout.noxview", "reprobox.core.spec"}, imported
