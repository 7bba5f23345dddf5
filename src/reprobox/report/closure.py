"""Which of a repro's files the commands a report shows need, and nothing else.

A maintainer saves the comment's files and runs its block; a file no shown command reads
only costs room (GitHub caps a comment at 65,536 characters), and a missing one ends every
pasted variant in `ModuleNotFoundError`. The script's imports are read statically: every
`import X` / `from X import ...` of a module beside it, every module name written as a
string inside `importlib.import_module(...)` / `__import__(...)` (a script that picks an
adapter by release names each candidate there), followed through the modules found; a
data file beside it is needed when the code names it as a string (`"config.yaml"`). A
command names its launcher config and its fix. Pure: file texts in, names out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping

_DYNAMIC = {"import_module", "__import__"}


def imported_names(source: str) -> tuple[set[str], set[str]]:
    """(the top-level modules `source` imports, every string constant it holds); text that
    does not parse imports nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set(), set()
    modules: set[str] = set()
    strings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and _callee(node.func) in _DYNAMIC:
            for arg in node.args[:1]:
                modules |= {
                    sub.value.split(".")[0]
                    for sub in ast.walk(arg)
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                }
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
    return modules, strings


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def needed(files: Mapping[str, str], roots: Iterable[str], named: Iterable[str] = ()) -> list[str]:
    """The names in `files` (name -> text, as shown: `common.py`, `fixes/x.py`) that
    `roots` (the script, the fixes the commands use) need, `named` (the configs the commands
    name) included; in the order of `files`."""
    by_module = {
        name.rsplit("/", 1)[-1].removesuffix(".py"): name for name in files if name.endswith(".py")
    }
    by_file = {name.rsplit("/", 1)[-1]: name for name in files}
    keep = {name for name in named if name in files}
    todo = [name for name in roots if name in files]
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        modules, strings = imported_names(files[name])
        todo += [by_module[m] for m in modules if m in by_module]
        todo += [by_file[s] for s in strings if s in by_file and not s.endswith(".py")]
    return [name for name in files if name in keep]
