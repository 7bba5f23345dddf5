"""A maintainer pastes the comment: its files and block in an empty folder, a fresh venv per
pin set made by the block itself with pip, no reprobox; every variant gives the verdict the
harness measured.

The block is run as written. Only three things come from outside it: each launcher line is
followed by an `echo` of its exit status (the test's reading, not a change to the line);
pip's own configuration (PIP_NO_INDEX, PIP_FIND_LINKS; no bytecode at install, as uv does:
`PIP_WITHOUT_BYTECODE`) supplies every distribution from a
wheelhouse of the repro's locked wheels, torch's CPU wheel included (the PyTorch CPU index
the block names cannot be reached from here), downloaded once by `reprobox wheelhouse` into
the harness's cache, so pip resolves the block's pins and installs them into each fresh venv
with no network; and the files a comment has no room for (kl's `gen_old.py`: the comment
holds what the shown runs read, and even that passes GitHub's 65,536 characters) are copied
from the report folder's `files/`, standing in for the secret gist `report --post` makes and
links (the comment names each and its place). The harness's verdicts are
those of the session's shared default run (`default_runs`, checked in test_repros_e2e).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from shared_runs import SharedRun, wheelhouse

from conftest import PIP_WITHOUT_BYTECODE, ROOT, newest_records, reprobox

pytestmark = pytest.mark.e2e

_FILE = re.compile(
    r"<details><summary><code>([^<]+)</code> \(\d+ lines\)</summary>\n\n(`{3,})\w*\n(.*?)\n\2\n",
    re.S,
)
_BLOCK = re.compile(r"### Reproduction\n.*?\n(`{3,})sh\n(.*?)\n\1\n", re.S)
_EXPECT = re.compile(r"^(.*\S)\s+# expect: (\w+)$")
CODES = {"reproduced": 1, "clean": 0, "cannot_test": 125}


def _paste(comment: str, into: Path, omitted: list[dict[str, str]], report: Path) -> str:
    """Write the comment's files under `into`; the block, each launcher line followed by
    an echo of its status."""
    files = _FILE.findall(comment)
    assert files, "the comment holds no file"
    for name, _, text in files:
        path = into / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    for item in omitted:  # the gist's files
        path = into / item["name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((report / item["path"]).read_text())
    block = _BLOCK.search(comment)
    assert block, "the comment holds no reproduction block"
    lines = []
    for line in block.group(2).splitlines():
        expect = _EXPECT.match(line)
        lines.append(line)
        if expect:
            variant = re.search(r"--variant (\S+)", expect.group(1))
            name = variant.group(1) if variant else "?"
            lines.append(f'echo "VERDICT {name} $?"')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    # kl's paste installs two environments with pip and runs DeepSpeed in each (866 s of
    # one CI worker): the nightly tier runs it; lm_head's and shuffle_seed's stay in make test
    "repro",
    ["lm_head", "shuffle_seed", pytest.param("kl", marks=[pytest.mark.slow, pytest.mark.nightly])],
)
def test_the_pasted_comment_gives_the_harness_verdicts(
    repro: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    default_runs: Callable[[str], SharedRun],
) -> None:
    done = default_runs(repro)  # `reprobox run REPRO`
    assert done.returncode == 0, done.stdout + done.stderr
    monkeypatch.setenv("REPROBOX_RESULTS", str(done.results))
    measured = {r["variant"]: r["verdict"] for r in newest_records(done.results, repro).values()}
    wheels = wheelhouse(ROOT, repro)
    made = reprobox("report", repro, "--no-env", "--out", str(tmp_path / "report"))
    assert made.returncode == 0, made.stdout + made.stderr
    comment = (tmp_path / "report" / "comment.md").read_text()
    assert "reprobox" not in _BLOCK.search(comment).group(2)  # type: ignore[union-attr]
    folder = tmp_path / "maintainer"
    folder.mkdir()
    omitted = json.loads((tmp_path / "report" / "comment-omitted.json").read_text())
    assert repro == "kl" or not omitted  # lm_head's and shuffle_seed's files all fit
    where = [line for line in comment.splitlines() if line.startswith("*The files not shown")]
    for item in omitted:  # each has its stub and its place: the link line --post fills in
        assert f"*`{item['name']}` (" in comment and f"`{item['name']}`" in where[0]
    script = _paste(comment, folder, omitted, tmp_path / "report")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REPRO", "VIRTUAL_ENV", "PYTHONPATH", "UV_"))
    }
    env |= {"PIP_RETRIES": "0", "PIP_TIMEOUT": "5", "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels), **PIP_WITHOUT_BYTECODE}  # fmt: skip
    ran = subprocess.run(
        ["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=1500
    )
    got = dict(re.findall(r"^VERDICT (\S+) (\d+)$", ran.stdout, re.M))
    assert {v: int(c) for v, c in got.items()} == {
        v: CODES[verdict] for v, verdict in measured.items()
    }, ran.stdout[-3000:] + ran.stderr[-3000:]
