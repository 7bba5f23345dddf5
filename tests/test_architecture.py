"""The architecture as rules, checked like code: the import-linter contracts of pyproject
(layers; a pure core; report and scale-out never reach the run back ends; a pure search; no
import cycle among the modules of any package), mypy (strict on core and bisect), and a thin
noxfile."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
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


def test_the_fakes_still_stand_for_their_protocols() -> None:
    """tests/fakes.py assigns each fake to the protocol it stands for (Backend,
    PackageIndex): a fake that drifts from it fails here, not in a test that trusts it."""
    done = subprocess.run([sys.executable, "-m", "mypy", "tests/fakes.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
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


SRC = ROOT / "src" / "reprobox"


def _calls(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.name}:{node.lineno} {node.func.id}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    ]


def test_design_rules_2_and_3_are_contracts() -> None:
    """The rules stay written as import-linter contracts (test_import_contracts_hold runs
    them): envs and run.layout import only core, back ends never import the pipeline, bisect
    never imports one back end, no cycle in envs."""
    text = (ROOT / "pyproject.toml").read_text()
    for name in (
        "DESIGN rule 2: envs imports only core",
        "DESIGN rule 2: run.layout imports only core",
        "DESIGN rule 2: the back ends never import the pipeline",
        "DESIGN rule 3: bisect reaches a back end through the pipeline",
        "no import cycle among the modules of envs",
    ):
        assert f'name = "{name}' in text, name


def test_the_pipeline_finds_no_capability_at_run_time() -> None:
    """Every capability the pipeline uses is declared (run/backend.py, run/capabilities.py):
    no getattr or hasattr on a back end or a handle where back ends are driven."""
    driving = ["pipeline.py", "host_check.py", "installs.py"]
    found = [c for name in driving for c in _calls(SRC / "run" / name, {"getattr", "hasattr"})]
    assert found == []
    assert _calls(SRC / "bisect" / "prober.py", {"hasattr"}) == []
    assert "getattr(backend" not in (SRC / "bisect" / "prober.py").read_text()


def _backend_classes() -> dict[str, str]:
    """Every back-end class under run/backends (a class with a `name` and a `launch`), by
    name, with the module it is in: found by reading the code, so a new one is seen."""
    found = {}
    for path in (SRC / "run" / "backends").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            names = {
                target.id
                for item in node.body
                if isinstance(item, (ast.Assign, ast.AnnAssign))
                for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
                if isinstance(target, ast.Name)
            }
            methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            if "name" in names and "launch" in methods:
                found[node.name] = path.name
    return found


def _constructions(path: Path, classes: set[str]) -> list[str]:
    return [call.split()[1] for call in _calls(path, classes)]


# A back end that wraps another builds the one it wraps (Slurm and the concurrent venv run
# the venv's prepare); nothing else builds one outside the registry.
WRAPPED = {("slurm.py", "VenvBackend"), ("detached.py", "VenvBackend")}


def test_one_registry_builds_every_back_end() -> None:
    """Every back-end class is built by the registry (run/backends/registry.py) and nowhere
    else but inside the back ends that wrap one; every class is reachable from a kind."""
    from reprobox.cli import options
    from reprobox.run.backends import registry

    classes = _backend_classes()
    assert set(classes) >= {"VenvBackend", "DetachedBackend", "ContainerBackend", "SlurmBackend"}
    outside = [
        f"{path.relative_to(SRC)} builds {name}"
        for path in SRC.rglob("*.py")
        if path.name != "registry.py"
        for name in _constructions(path, set(classes))
        if (path.name, name) not in WRAPPED
    ]
    assert outside == []
    built = set(_constructions(SRC / "run" / "backends" / "registry.py", set(classes)))
    assert built == set(classes), f"no kind builds {sorted(set(classes) - built)}"
    assert options.OPTIONS["backend"].choices == registry.NAMES
    assert set(registry.NAMES) == {"venv", "container", "slurm"}


def test_bisect_reaches_run_only_through_the_pipeline_interface_and_factory() -> None:
    """DESIGN rule 3, as an allow-list: of run, bisect imports the pipeline, the interface,
    the capabilities and the factory, nothing else (the contract forbids the back ends)."""
    allowed = {"pipeline", "backend", "capabilities", "backends"}
    for path in (SRC / "bisect").glob("*.py"):
        used = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "reprobox.run":
                used |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "reprobox.run."
            ):
                used.add((node.module or "").split(".", 3)[2])
                if (node.module or "").count(".") > 2:
                    used.add(node.module or "")
        assert used <= allowed, f"{path.name}: {sorted(used - allowed)}"


def test_no_two_siblings_import_each_other_in_any_package() -> None:
    """Modules are cut by concept, not by size: within every package of reprobox its modules
    import each other without a cycle (import-linter's acyclic_siblings over the whole tree,
    which test_import_contracts_hold runs), TYPE_CHECKING and function-local imports counted,
    no import ignored; a type two modules share lives in a leaf module below both."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    acyclic = [c for c in contracts["contracts"] if c["type"] == "acyclic_siblings"]
    whole = [c for c in acyclic if c["ancestors"] == ["reprobox"]]
    assert len(whole) == 1, acyclic
    assert not whole[0].get("ignore_imports") and not whole[0].get("skip_descendants")
    assert whole[0].get("depth", 10) >= 10  # every package: reprobox.run.backends is depth 2
    assert not contracts.get("exclude_type_checking_imports")


def test_a_function_local_import_says_why() -> None:
    """An import inside a function is there for start-up cost (or an optional dependency),
    never to hide a cycle: each says why on its line or the line above."""
    silent = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().splitlines()
        for func in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                said = lines[node.lineno - 1] + lines[(node.end_lineno or node.lineno) - 1]
                above = node.lineno - 2  # a run of imports shares the comment above it
                while lines[above].lstrip().startswith(("from ", "import ")):
                    above -= 1
                if "#" not in said and not lines[above].lstrip().startswith("#"):
                    silent.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert silent == []
