"""`reprobox attribute` through the real CLI: two tiny packages (real wheels on a real PEP
503/691 index on 127.0.0.1, installed by uv) both change between two `pip freeze` files,
and only one's change flips the repro's verdict, from its release 1.2.0 on. The command
names that package and that release, in one line, with its assumption; run again it reads
every probe from its log."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheel_index import WheelIndex, write_wheel

from conftest import reprobox
from reprobox.core.errors import ExitCode

# its module-scoped fixture is built once: all of it on one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tests/test_attribute_e2e.py")]

FLIP, OTHER = "reprobox-flip", "reprobox-bystander"
FLIP_VERSIONS = ["1.0.0", "1.1.0", "1.2.0", "1.3.0"]  # reproduces from 1.2.0 on
OTHER_VERSIONS = ["1.0.0", "2.0.0"]  # changes too, and changes nothing

TOML = f"""\
[repro]
title = "a flag that a dependency's release turns on"
upstream = "https://example.invalid/flip"
script = "flip.py"

[launch]
launcher = "python"
processes = 1
timeout = 60

[env]
python = "3.11"
pins = ["{FLIP}==1.0.0", "{OTHER}==1.0.0"]

[verdict]
reproduced_if = [{{ metric = "flag", above = 0.5 }}]

[variants.broken]
expect = "reproduced"
"""

SCRIPT = """\
import json, os, sys
import flippkg, bystanderpkg
flag = float(flippkg.FLAG)
verdict = "reproduced" if flag > 0.5 else "clean"
result = {"schema": 1, "variant": "broken", "verdict": verdict,
          "metrics": {"flag": flag}, "reason": f"flippkg {flippkg.VERSION}"}
with open(os.environ["REPRO_RESULT"], "w") as handle:
    json.dump(result, handle)
sys.exit({"clean": 0, "reproduced": 1}[verdict])
"""


@pytest.fixture(scope="module")
def flip_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("flip-wheels")
    for version in FLIP_VERSIONS:
        flag = int(version >= "1.2.0")
        init = f"VERSION = {version!r}\nFLAG = {flag}\n"
        write_wheel(folder, FLIP, version, {"flippkg/__init__.py": init})
    for version in OTHER_VERSIONS:
        write_wheel(folder, OTHER, version, {"bystanderpkg/__init__.py": f"V = {version!r}\n"})
    with WheelIndex([folder]) as index:
        yield index.url


@pytest.fixture
def flip_root(
    scratch_root: Path, flip_index: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    directory = scratch_root / "repros" / "flip"
    directory.mkdir()
    (directory / "repro.toml").write_text(TOML)
    (directory / "flip.py").write_text(SCRIPT)
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))  # its own release list
    monkeypatch.setenv("UV_INDEX_URL", flip_index)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    return scratch_root


def _attribute(*args: str) -> subprocess.CompletedProcess[str]:
    return reprobox("attribute", "flip", "--variant", "broken", *args)


def test_attribute_names_the_package_and_its_release(flip_root: Path) -> None:
    before, after = flip_root / "before.txt", flip_root / "after.txt"
    before.write_text(f"{FLIP}==1.0.0\n{OTHER}==1.0.0\n")  # as `pip freeze` writes them
    after.write_text(f"{OTHER}==2.0.0\n{FLIP}==1.3.0\n")
    done = _attribute("--from", str(before), "--to", str(after))
    assert done.returncode == ExitCode.OK, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    print(last)  # shown with -s
    assert last.startswith(
        f"culprit: {FLIP} 1.2.0 (its change from 1.0.0 to 1.3.0 flips broken from clean to "
        "reproduced; 2 packages differ between the ends; "
    ), last
    assert last.endswith("assuming one package's change flips it and its releases are monotone)")

    again = _attribute("--from", str(before), "--to", str(after), "--json")
    assert again.returncode == ExitCode.OK, again.stderr
    doc = json.loads(again.stdout)
    summary = doc["summary"]
    assert (doc["command"], doc["exit_code"]) == ("attribute", 0)
    details = summary["details"]  # a kind's own fields (--json version 2)
    assert (summary["kind"], details["package"], summary["first"]) == ("attribution", FLIP, "1.2.0")
    assert details["culprit"] == [f"{FLIP} 1.0.0 -> 1.3.0"] and doc["version"] == 2
    assert summary["launched"] == 0 and all(p["resumed"] for p in summary["probes"])


def test_attribute_refuses_ends_alike_and_bad_ends(flip_root: Path) -> None:
    same = flip_root / "same.txt"
    same.write_text(f"{FLIP}==1.0.0\n{OTHER}==2.0.0\n")
    start = flip_root / "start.txt"
    start.write_text(f"{FLIP}==1.1.0\n{OTHER}==1.0.0\n")
    done = _attribute("--from", str(start), "--to", str(same))
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert "both ends are clean in 3 launches each" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("reprobox: error: ")
    for end, message in ((str(flip_root / "missing.txt"), "not a file"),
                         (str(start), "pin the same versions")):  # fmt: skip
        done = _attribute("--from", str(start), "--to", end)
        assert done.returncode == ExitCode.BAD_INPUT and message in done.stderr, done.stderr
