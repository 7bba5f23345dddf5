"""The suite's worker groups hold: a module whose module- or session-scoped fixture must be
built once declares its group, and the pinned pytest and pytest-xdist keep a group on one
worker (pytest 9 silently split every group: pytest-xdist#1386)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _scope_of(decorator: ast.expr) -> str | None:
    """The scope a `@pytest.fixture(scope=...)` decorator names, if any."""
    if isinstance(decorator, ast.Call):
        for keyword in decorator.keywords:
            if keyword.arg == "scope" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
    return None


def test_a_module_with_a_fixture_built_once_declares_its_worker_group() -> None:
    missing = []
    for path in sorted(TESTS.glob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        wide = [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
            and any(_scope_of(d) in ("module", "session") for d in node.decorator_list)
        ]
        grouped = f'xdist_group("tests/{path.name}")' in source
        container = "pytest.mark.container]" in source or "pytest.mark.container," in source
        if wide and not (grouped or container):
            missing.append(f"{path.name}: {', '.join(wide)}")
    assert not missing, f"module-scoped fixtures without a worker group: {missing}"


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os, pytest\n"
            'pytestmark = pytest.mark.xdist_group("g")\n'
            '@pytest.mark.parametrize("i", range(4))\n'
            "def test_one(i):\n"
            f'    open("workers-{name}-" + str(i), "w").write(os.environ["PYTEST_XDIST_WORKER"])\n'
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {p.read_text() for p in tmp_path.glob("workers-*")}
    assert len(list(tmp_path.glob("workers-*"))) == 8
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"
