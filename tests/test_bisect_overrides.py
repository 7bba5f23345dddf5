"""Release bisects and sweeps with another package at a git ref (`--with NAME@git+URL@REF`):
the ref is resolved to one sha when the bisect starts, every probe runs that commit and its
record names it, the summary names it, and the override changes the answer. Real git, real uv
builds and environments, real runs of a one-process fixture repro (no torch); the release
list is a fake index, the releases themselves real wheels on a static simple index served
over HTTP on 127.0.0.1 (uv's extra index)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from bisect_fakes import FakeIndex
from gitrepo_fixture import PACKAGE, FlagRepo
from packaging.version import Version

from conftest import reprobox
from reprobox.bisect.prober import Target, check_checkouts, pin_overrides
from reprobox.bisect.summary import BisectSummary, read_summary
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode
from reprobox.core.settings import Settings
from reprobox.envs import git
from reprobox.envs.index import Release
from reprobox.envs.uv import uv_bin
from reprobox.run import pipeline

# its module-scoped fixture is built once: all of it on one worker
pytestmark = pytest.mark.xdist_group("tests/test_bisect_overrides.py")

GATE = "reprobox-gatepkg"
GATE_VERSIONS = ["1.0.0", "1.1.0", "1.2.0", "1.3.0"]  # GATE on from 1.2.0

PAIR_TOML = f"""\
[repro]
title = "reproduces when flagpkg.BROKEN and gatepkg.GATE are both on"
upstream = "https://example.invalid/pair"
script = "pair.py"

[launch]
launcher = "python"
processes = 1
timeout = 60

[env]
python = "3.11"
pins = ["{PACKAGE}==0.1.0", "{GATE}==1.0.0"]

[verdict]
reproduced_if = [{{ metric = "both", above = 0.5 }}]

[variants.broken]
expect = "unknown"
"""

PAIR_SCRIPT = """\
import json, os, sys
import flagpkg, gatepkg
both = 1.0 if flagpkg.BROKEN and gatepkg.GATE else 0.0
verdict = "reproduced" if both else "clean"
result = {"schema": 1, "variant": "broken", "verdict": verdict, "metrics": {"both": both},
          "reason": f"BROKEN={flagpkg.BROKEN} GATE={gatepkg.GATE}"}
with open(os.environ["REPRO_RESULT"], "w") as handle:
    json.dump(result, handle)
sys.exit({"clean": 0, "reproduced": 1}[verdict])
"""

GATE_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "reprobox-gatepkg"
version = "{version}"

[tool.setuptools]
packages = ["gatepkg"]
"""


@pytest.fixture(scope="module")
def gate_index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real wheel of every gatepkg release, on a PEP 503 index served on 127.0.0.1 (a
    static tree: the standard library's file server answers the HEAD requests uv makes)."""
    root = tmp_path_factory.mktemp("gate-index")
    out = root / "files"
    for version in GATE_VERSIONS:
        source = tmp_path_factory.mktemp(f"gate-{version}")
        (source / "pyproject.toml").write_text(GATE_PYPROJECT.format(version=version))
        (source / "gatepkg").mkdir()
        gate = Version(version) >= Version("1.2.0")
        (source / "gatepkg" / "__init__.py").write_text(f"GATE = {gate}\n")
        subprocess.run(
            [uv_bin(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(source)],
            check=True,
        )
    links = [
        f'<a href="../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
        f"{w.name}</a>"
        for w in sorted(out.glob("*.whl"))
    ]
    page = root / "simple" / GATE / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text("<!DOCTYPE html><html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n")
    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _write_pair(root: Path) -> None:
    """The `pair` repro under `root` (its repro.toml and script)."""
    directory = root / "repros" / "pair"
    directory.mkdir()
    (directory / "repro.toml").write_text(PAIR_TOML)
    (directory / "pair.py").write_text(PAIR_SCRIPT)


def gate_index() -> FakeIndex:
    return FakeIndex({GATE: [Release(Version(v)) for v in GATE_VERSIONS]})


@pytest.fixture
def pair_root(
    scratch_root: Path, shared_cache: Path, gate_index_url: str, monkeypatch: pytest.MonkeyPatch
) -> Path:
    _write_pair(scratch_root)
    monkeypatch.setenv("REPROBOX_CACHE", str(shared_cache))
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", gate_index_url)
    git._moving.clear()
    git._fetched.clear()
    return scratch_root


def _bisect_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """The real CLI, in this process, with the fake release list."""
    from reprobox.cli import cells as cli_cells
    from reprobox.cli import main as cli_main

    monkeypatch.setattr(cli_cells, "index", lambda args: gate_index())
    code = cli_main.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _summary(err: str) -> BisectSummary:
    line = next(x for x in err.splitlines() if "summary: " in x)
    return read_summary(Path(line.split("summary: ")[1].strip()))


def _probe_records(summary: BisectSummary) -> list[dict]:
    """The record of every probe launched (resumed or reused ones have none of their own)."""
    return [
        json.loads((Path(probe.record) / "record.json").read_text())
        for probe in summary.probes
        if probe.record and probe.fresh
    ]


@pytest.mark.e2e
def test_an_override_at_a_git_ref_is_one_commit_in_every_probe_and_changes_the_answer(
    flagrepo: FlagRepo,
    pair_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ends = ["--package", GATE, "--good", "1.0.0", "--bad", "1.3.0", "--variant", "broken"]
    culprit = flagrepo.shas["feature3"]  # refs/pull/15/head: BROKEN on
    code, out, err = _bisect_cli(
        monkeypatch, capsys, "bisect", "pair", *ends,
        "--with", f"{PACKAGE}@git+{flagrepo.url}@refs/pull/15/head",
    )  # fmt: skip
    assert code == 0, err
    summary = _summary(err)
    assert summary.status == "found" and summary.first == "1.2.0"
    assert summary.overrides == {PACKAGE: f"git+{flagrepo.url}@{culprit}"}
    assert summary.override_commits == {PACKAGE: culprit}
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"first reproducing release: {GATE} 1.2.0 (assuming one change")
    assert f"with {PACKAGE} at commit {culprit}" in last
    records = _probe_records(summary)
    assert len(records) == summary.launched >= 3
    for record in records:
        assert record["commits"] == {PACKAGE: culprit}
        assert record["packages"][PACKAGE] == f"git+{flagrepo.url}@{culprit}"

    # The same bisect at a tag where BROKEN is off: both ends clean, so no answer at all.
    code, out, err = _bisect_cli(
        monkeypatch, capsys, "bisect", "pair", *ends,
        "--with", f"{PACKAGE}@git+{flagrepo.url}@v0.1.0",
    )  # fmt: skip
    assert code == ExitCode.BAD_INPUT
    assert "--bad 1.3.0 is clean, not reproduced: both ends are clean" in err

    # A sweep takes the same flags; its map names the commit too.
    code, out, err = _bisect_cli(
        monkeypatch, capsys, "sweep", "pair", "--package", GATE, "--variant", "broken",
        "--range", ">=1.1.0,<=1.2.0", "--with", f"{PACKAGE}@git+{flagrepo.url}@{culprit}",
    )  # fmt: skip
    assert code == 0, err
    # the verdicts on disk: the bisect's above (ends, search, --confirm 2 at the boundary)
    assert out.strip().splitlines()[-1] == (
        f"{GATE} affected: ==1.2.0 (2 of 2 releases tested; with {PACKAGE} at commit {culprit}; "
        "6 verdict(s) on disk agree; still reproduces at 1.2.0, the range's last release)"
    )


@pytest.mark.e2e
def test_a_commit_bisect_takes_another_package_at_a_version(
    flagrepo: FlagRepo,
    pair_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--with` on a commit bisect: every probe builds flagpkg's commit beside gatepkg at the
    given release, recorded per probe; at a release where GATE is off nothing reproduces."""
    ends = ["--package", PACKAGE, "--commits", "--repo", str(flagrepo.path), "--variant",
            "broken", "--good", "v0.1.0", "--bad", "v0.2.0"]  # fmt: skip
    code, _, err = _bisect_cli(monkeypatch, capsys, "bisect", "pair", *ends,
                                 "--with", f"{GATE}==1.2.0")  # fmt: skip
    assert code == 0, err
    summary = _summary(err)
    assert summary.status == "found" and summary.first == flagrepo.shas["merge"]
    assert summary.overrides == {GATE: "1.2.0"}
    for record in _probe_records(summary):
        assert record["packages"][GATE] == "1.2.0"
    code, _, err = _bisect_cli(monkeypatch, capsys, "bisect", "pair", *ends,
                                 "--with", f"{GATE}==1.0.0")  # fmt: skip
    assert code == ExitCode.BAD_INPUT
    assert "both ends are clean" in err


def test_a_moving_ref_is_resolved_once_when_the_bisect_starts(
    flagrepo: FlagRepo, scratch_root: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "moving"
    subprocess.run(["git", "clone", "-q", "--bare", str(flagrepo.path), str(copy)], check=True)
    subprocess.run(["git", "branch", "-f", "fix", flagrepo.shas["docs"]], cwd=copy, check=True)
    _write_pair(scratch_root)
    settings = Settings.from_env(
        {"REPROBOX_ROOT": str(scratch_root), "REPROBOX_CACHE": str(tmp_path / "cache")}
    )
    repro = spec.load(scratch_root, "pair")
    source = f"git+{copy.as_uri()}@fix"
    target = Target(repro, "broken", pipeline.RunOptions(), settings, overrides={PACKAGE: source})
    git._moving.clear()
    pinned = pin_overrides(target, [GATE])
    sha = flagrepo.shas["docs"]
    assert pinned.overrides == {PACKAGE: f"git+{copy.as_uri()}@{sha}"}
    assert pinned.commits == {PACKAGE: sha}
    assert pinned.header()["override_commits"] == {PACKAGE: sha}
    assert (tmp_path / "cache" / "git-wheels" / sha).is_dir()  # built once, up front
    # the branch moves: a probe cell of this bisect still names the first sha
    subprocess.run(["git", "branch", "-f", "fix", flagrepo.shas["merge"]], cwd=copy, check=True)
    assert dict(pinned.packages({GATE: "1.1.0"}))[PACKAGE].endswith(f"@{sha}")
    assert pinned.header() != {}  # a bisect started after the move is another bisect
    with pytest.raises(BadInput, match="that is a package this bisect searches"):
        pin_overrides(target, [PACKAGE])
    with pytest.raises(BadInput, match="not a package that pair pins"):
        pin_overrides(Target(repro, "broken", pipeline.RunOptions(), settings,
                             overrides={"numpy": "1.26.0"}), [GATE])  # fmt: skip
    assert (
        pin_overrides(Target(repro, "broken", pipeline.RunOptions(), settings), [GATE]).header()
        == {}
    )


def test_overriding_the_package_searched_is_bad_input(scratch_root: Path) -> None:
    _write_pair(scratch_root)
    ends = ["--package", GATE, "--good", "1.0.0", "--bad", "1.3.0", "--variant", "broken"]
    cases = [
        ("bisect", "--with", f"{GATE}@git+file:///nowhere/gate@main"),
        ("bisect", "--with", f"{GATE}==1.1.0"),
        ("sweep", "--with-editable", f"{GATE}={scratch_root}"),
    ]
    for command, flag, value in cases:
        extra = ends if command == "bisect" else [*ends[:2], "--range", ">=1.0", *ends[-2:]]
        done = reprobox(command, "pair", *extra, flag, value)
        assert done.returncode == ExitCode.BAD_INPUT, done.stderr
        errors = [x for x in done.stderr.splitlines() if x.startswith("reprobox: error:")]
        assert len(errors) == 1 and "that is a package this bisect searches" in errors[0], (
            done.stderr
        )
        assert "Traceback" not in done.stderr


def test_a_checkout_that_changes_mid_bisect_stops_it(
    flagrepo: FlagRepo, scratch_root: Path, tmp_path: Path
) -> None:
    checkout = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(flagrepo.path), str(checkout)], check=True)
    _write_pair(scratch_root)
    settings = Settings.from_env(
        {"REPROBOX_ROOT": str(scratch_root), "REPROBOX_CACHE": str(tmp_path / "cache")}
    )
    repro = spec.load(scratch_root, "pair")
    overrides = {PACKAGE: checkout.as_uri()}
    target = Target(repro, "broken", pipeline.RunOptions(), settings, overrides=overrides)
    pinned = pin_overrides(target, [GATE])
    assert pinned.commits == {PACKAGE: flagrepo.shas["release"]}  # a clean checkout: HEAD
    check_checkouts(pinned)  # unchanged: fine
    (checkout / "flagpkg" / "_broken.py").write_text("BROKEN = False\n")  # an edit
    with pytest.raises(BadInput, match=f"the checkout of {PACKAGE} changed during the bisect"):
        check_checkouts(pinned)
