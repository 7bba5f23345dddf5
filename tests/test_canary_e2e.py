"""The nightly canary run for real, as .github/workflows/canary.yml runs it: `reprobox
canary-plan` names a corpus repro's (repro, package), `reprobox newest PACKAGE` reads the
newest release from the index, and `reprobox run REPRO --variant fixed --with
PACKAGE==NEWEST --with COMPANION==NEWEST` fails when that release brings the bug back. A toy
corpus repro over a package on a real PEP 503 index on 127.0.0.1 (real wheels, installed by
uv): 1.0.0 good, 1.1.0 bad, 1.2.0 the fix, then either 1.2.1 (still fixed: the canary passes)
or 1.3.0 (the bug re-introduced: it fails, and the failure names the repro and the release).
A bug still open upstream (`open = true` in its truth) is watched through `broken`: 1.1.1
(still broken: it passes) or 1.2.1 (fixed upstream: it fails, naming the release that fixed
it).
Both newest releases need a newer companion than the repro pins (2.0.0, as transformers 5
needs a newer accelerate): beside the pinned 1.0.0 they fail to import, so the canary must
move the companion too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wheel_index import WheelIndex, write_wheel

from conftest import reprobox

pytestmark = pytest.mark.e2e

PACKAGE = "reprobox-regress"
COMPANION = "reprobox-companion"  # pinned exactly by the repro; the newest PACKAGE needs 2.0.0
BAD = {"1.1.0", "1.1.1", "1.3.0"}  # the releases that carry the bug
NEEDS_NEW_COMPANION = {"1.1.1", "1.2.1", "1.3.0"}

TOML = f"""\
[repro]
title = "a value regressed by {PACKAGE} 1.1.0 and fixed in 1.2.0"
upstream = "https://example.invalid/regress"
script = "regress.py"

[launch]
launcher = "python"
processes = 1
timeout = 60

[env]
python = "3.11"
pins = ["{PACKAGE}==1.1.0", "{COMPANION}==1.0.0"]

[verdict]
reproduced_if = [{{ metric = "wrong", above = 0.5 }}]

[variants.broken]
expect = "reproduced"

[variants.fixed]
expect = "clean"
pins = ["{PACKAGE}==1.2.0"]

[bisect]
package = "{PACKAGE}"
variant = "broken"
good = "1.0.0"
bad = "1.1.0"

[truth]
package = "{PACKAGE}"
last_good = "1.0.0"
first_bad = "1.1.0"
first_fixed = "1.2.0"
symptom = "value"
verified = "the test's own wheels"
"""

SCRIPT = """\
import json, os, sys
import regresspkg
wrong = float(regresspkg.BROKEN)
verdict = "reproduced" if wrong > 0.5 else "clean"
result = {"schema": 1, "variant": sys.argv[2], "verdict": verdict,
          "metrics": {"wrong": wrong}, "reason": f"regresspkg {regresspkg.VERSION}"}
if os.environ.get("REPRO_RESULT"):
    with open(os.environ["REPRO_RESULT"], "w") as handle:
        json.dump(result, handle)
sys.exit({"clean": 0, "reproduced": 1}[verdict])
"""


def _canary_root(
    scratch_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    versions: list[str],
    open_upstream: bool,
) -> WheelIndex:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for version in versions:
        init = f"VERSION = {version!r}\nBROKEN = {version in BAD}\n"
        if version in NEEDS_NEW_COMPANION:  # an import-time check, as transformers makes
            init += "import companionpkg\nassert companionpkg.VERSION >= '2', 'companion>=2'\n"
        write_wheel(folder, PACKAGE, version, {"regresspkg/__init__.py": init})
    for version in ("1.0.0", "2.0.0"):
        write_wheel(
            folder, COMPANION, version, {"companionpkg/__init__.py": f"VERSION = {version!r}\n"}
        )
    directory = scratch_root / "repros" / "regress"
    directory.mkdir()
    toml = TOML
    if open_upstream:  # no release fixed it: `fixed` is the last good release
        toml = toml.replace('first_fixed = "1.2.0"\n', "open = true\n").replace(
            f'pins = ["{PACKAGE}==1.2.0"]', f'pins = ["{PACKAGE}==1.0.0"]'
        )
    (directory / "repro.toml").write_text(toml)
    (directory / "regress.py").write_text(SCRIPT)
    monkeypatch.setenv("REPROBOX_CACHE", str(tmp_path / "cache"))  # its own release list
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    return WheelIndex([folder])


def _canary(variant: str) -> tuple[str, int, str]:
    """The workflow's three steps: the plan's package, variant and companions, their newest
    releases, the variant's run with each of them."""
    plan = reprobox("canary-plan")
    assert plan.returncode == 0, plan.stderr
    include = json.loads(plan.stdout.split("include=", 1)[1])
    entry = {"repro": "regress", "package": PACKAGE, "variant": variant, "with": [COMPANION]}
    assert entry in include
    newest = reprobox("newest", "--as-pins", PACKAGE, *entry["with"])
    assert newest.returncode == 0, newest.stderr
    pins = newest.stdout.split()
    assert pins[1] == f"{COMPANION}==2.0.0", pins
    done = reprobox("run", "regress", "--variant", variant, *(f"--with={pin}" for pin in pins))
    return pins[0].split("==")[1], done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    "versions, open_upstream, newest, fails",
    [
        (["1.0.0", "1.1.0", "1.2.0", "1.2.1"], False, "1.2.1", False),
        (["1.0.0", "1.1.0", "1.2.0", "1.3.0"], False, "1.3.0", True),
        (["1.0.0", "1.1.0", "1.1.1"], True, "1.1.1", False),
        (["1.0.0", "1.1.0", "1.2.1"], True, "1.2.1", True),
    ],
    ids=["still-fixed", "re-introduced", "open-still-broken", "open-fixed-upstream"],
)
def test_the_canary_fails_when_the_newest_release_changes_the_verdict(
    scratch_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    versions: list[str],
    open_upstream: bool,
    newest: str,
    fails: bool,
) -> None:
    variant = "broken" if open_upstream else "fixed"
    with _canary_root(scratch_root, tmp_path, monkeypatch, versions, open_upstream) as index:
        monkeypatch.setenv("UV_INDEX_URL", index.url)
        version, code, output = _canary(variant)
    print(output)  # shown with -s: what the canary job's log shows
    assert version == newest
    if not fails:
        assert code == 0, output
        return
    assert code == 1, output  # an unexpected verdict (docs/cli.md): the job fails
    cell = f"{variant}[{PACKAGE}={newest},{COMPANION}=2.0.0]"
    expected = "clean, expected reproduced" if open_upstream else "reproduced, expected clean"
    line = f"reprobox: error: regress {cell}: {expected}"
    assert line in output, output  # the repro, the variant and the release that changed it
