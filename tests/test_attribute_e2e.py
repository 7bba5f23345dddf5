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
# A pair that installs only together, as transformers 5 and huggingface-hub 1 do: flip 1.5.0
# refuses bystander 3, flip 3.0.0 and its rc's need it; the flag is on from 3.0.0rc2.
PAIR_FLIP = {
    "1.5.0": (0, "<3"), "3.0.0rc1": (0, ">=3"), "3.0.0rc2": (1, ">=3"), "3.0.0": (1, ">=3"),
}  # fmt: skip
PAIR_OTHER = ["3.0.0", "3.1.0"]

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
    for version, (flag, other) in PAIR_FLIP.items():
        init = f"VERSION = {version!r}\nFLAG = {flag}\n"
        write_wheel(folder, FLIP, version, {"flippkg/__init__.py": init}, (f"{OTHER}{other}",))
    for version in OTHER_VERSIONS + PAIR_OTHER:
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


def test_attribute_tells_apart_a_pair_that_installs_only_together(flip_root: Path) -> None:
    """Neither package's change installs without the other's, so delta debugging stops at
    the pair; the flip's own releases, the bystander left to uv, name its pre-release."""
    before, after = flip_root / "before.txt", flip_root / "after.txt"
    before.write_text(f"{FLIP}==1.5.0\n{OTHER}==2.0.0\n")
    after.write_text(f"{FLIP}==3.0.0\n{OTHER}==3.1.0\n")
    done = _attribute("--from", str(before), "--to", str(after), "--json")
    assert done.returncode == ExitCode.OK, done.stderr
    summary = json.loads(done.stdout)["summary"]
    details = summary["details"]
    print(summary["result"])  # shown with -s
    assert (details["package"], summary["first"], summary["last_start"]) == (
        FLIP, "3.0.0rc2", "3.0.0rc1",
    )  # fmt: skip
    assert details["held"] == {OTHER: "3.1.0"}
    assert details["split_tries"] == [
        f"{OTHER}: its edge 2.0.0 -> 3.0.0 moved {FLIP} 1.5.0 -> 3.0.0 too",
        f"{FLIP}: its edge 3.0.0rc1 -> 3.0.0rc2 with {OTHER} at 3.1.0 on both sides",
    ]
    assert summary["result"].startswith(
        f"culprit: {FLIP} 3.0.0rc2 (its release flips broken from clean to reproduced with "
        f"{OTHER} at 3.1.0 on both sides of it; "
    )
    # the exact pin sets of one change alone could not be installed: skips, not verdicts
    assert any(p["skip"] for p in summary["probes"])


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
