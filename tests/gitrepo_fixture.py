"""A real git repository of a tiny installable package with a known history, for commit
bisects (tests/test_commits.py, tests/test_git_refs.py, tests/bench/bench_commits.py).

First-parent history of `main`, oldest first (N = 8):

    0 initial      tag v0.1.0; BROKEN and SLOW off
    1 docs
    2 squash       "Add a slow path (#12)": SLOW on (a squash-merged pull request)
    3 unbuildable  pyproject.toml is not TOML: `uv build` fails
    4 buildfix     builds again
    5 merge        "Merge pull request #15 from carol/feature" (second parent: feature3)
    6 later
    7 release      version 0.2.0, tag v0.2.0

`feature` forks from `docs`: feature1 (a refactor), feature2 (BROKEN on: the culprit, by
Carol Culprit), feature3; `refs/pull/15/head` points at feature3. `side` forks from `initial`
and is never merged (not an ancestor of `release`, nor it of `side`). Dates are fixed, so
the shas are the same in every run.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "reprobox-flagpkg"
MODULE = "flagpkg"

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
requires-python = ">=3.8"

[tool.setuptools]
packages = ["{module}"]
"""

AUTHORS = {
    "ada": ("Ada Initial", "ada@example.invalid"),
    "bob": ("Bob Refactor", "bob@example.invalid"),
    "carol": ("Carol Culprit", "carol@example.invalid"),
    "dan": ("Dan Squash", "dan@example.invalid"),
    "eve": ("Eve Merger", "eve@example.invalid"),
}


@dataclass
class FlagRepo:
    """The repository and its commits by name (see the module docstring)."""

    path: Path
    shas: dict[str, str] = field(default_factory=dict)
    _clock: int = 1_700_000_000

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def git(self, *args: str, who: str = "ada") -> str:
        name, email = AUTHORS[who]
        self._clock += 60
        stamp = f"{self._clock} +0000"
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_DATE": stamp,
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        proc = subprocess.run(
            ["git", *args], cwd=self.path, env=env, capture_output=True, text=True, check=True
        )
        return proc.stdout.strip()

    def write(self, relative: str, text: str) -> None:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def commit(self, name: str, subject: str, who: str = "ada") -> str:
        self.git("add", "-A", who=who)
        self.git("commit", "--quiet", "-m", subject, who=who)
        self.shas[name] = self.git("rev-parse", "HEAD")
        return self.shas[name]

    def first_parent(self) -> list[str]:
        """The names of main's first-parent line, oldest first."""
        return ["initial", "docs", "squash", "unbuildable", "buildfix", "merge", "later", "release"]


def _pyproject(version: str) -> str:
    return PYPROJECT.format(name=PACKAGE, version=version, module=MODULE)


def make_repo(path: Path) -> FlagRepo:
    """Build the repository of the module docstring at `path` (a new folder)."""
    path.mkdir(parents=True)
    repo = FlagRepo(path)
    repo.git("init", "--quiet", "--initial-branch=main")
    repo.write("pyproject.toml", _pyproject("0.1.0"))
    repo.write(
        f"{MODULE}/__init__.py",
        f'__version__ = "0.1.0"\nfrom {MODULE}._broken import BROKEN\n'
        f"from {MODULE}._slow import SLOW\n",
    )
    repo.write(f"{MODULE}/_broken.py", "BROKEN = False\n")
    repo.write(f"{MODULE}/_slow.py", "SLOW = False\n")
    repo.commit("initial", "Initial flagpkg")
    repo.git("tag", "v0.1.0")
    repo.write("README.md", "flagpkg: flags for tests\n")
    repo.commit("docs", "Add docs")

    repo.git("checkout", "--quiet", "-b", "feature")
    repo.write(f"{MODULE}/_notes.py", "NOTES = 'refactored'\n")
    repo.commit("feature1", "feature: refactor the flags", who="bob")
    repo.write(f"{MODULE}/_broken.py", "BROKEN = True\n")
    repo.commit("feature2", "feature: turn BROKEN on", who="carol")
    repo.write("docs/feature.md", "the feature\n")
    repo.commit("feature3", "feature: tidy the docs", who="bob")
    repo.git("update-ref", "refs/pull/15/head", repo.shas["feature3"])

    repo.git("checkout", "--quiet", "main")
    repo.write(f"{MODULE}/_slow.py", "SLOW = True\n")
    repo.commit("squash", "Add a slow path (#12)", who="dan")
    repo.write("pyproject.toml", "[build-system\nthis is not toml\n")
    repo.commit("unbuildable", "Break the build")
    repo.write("pyproject.toml", _pyproject("0.1.0"))
    repo.commit("buildfix", "Fix the build")
    repo.git(
        "merge", "--quiet", "--no-ff", "-m", "Merge pull request #15 from carol/feature",
        "feature", who="eve",
    )  # fmt: skip
    repo.shas["merge"] = repo.git("rev-parse", "HEAD")
    repo.write("CHANGES.md", "later\n")
    repo.commit("later", "Later work")
    repo.write("pyproject.toml", _pyproject("0.2.0"))
    init = (path / MODULE / "__init__.py").read_text().replace('"0.1.0"', '"0.2.0"')
    repo.write(f"{MODULE}/__init__.py", init)
    repo.commit("release", "Release 0.2.0")
    repo.git("tag", "v0.2.0")

    repo.git("checkout", "--quiet", "-b", "side", repo.shas["initial"])
    repo.write("SIDE.md", "never merged\n")
    repo.commit("side", "A side line")
    repo.git("checkout", "--quiet", "main")
    return repo
