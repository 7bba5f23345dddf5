"""Every corpus repro (one with a `[truth]`) is consistent with its truth, cheaply.

`make test` checks only this: the spec loads, the package whose releases hold the edges is
pinned, the `broken` variant pins a release inside [first_bad, first_fixed) and the `fixed`
one a release outside it, and the repro's README.md shows the edge table. That every lock is
current is tests/test_nox_and_locks.py's `test_committed_locks_agree_with_repro_toml`, for
every repro (corpus ones included). Running the corpus for real is the nightly tier's
(`test_corpus_default_variants_give_their_expected_verdicts`, below).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from shared_runs import SharedRun
from test_repros_e2e import expected_cells

from conftest import ROOT, newest_records
from reprobox.core.errors import ExitCode
from reprobox.core.spec import Repro, discover, load

CORPUS = [name for name in discover(ROOT) if load(ROOT, name).corpus]


def pinned_release(repro: Repro, variant: str, package: str) -> Version | None:
    """The exact release of `package` a variant installs, or None when it pins no `==`."""
    for pin in repro.requirements(variant):
        requirement = Requirement(pin)
        if canonicalize_name(requirement.name) != canonicalize_name(package):
            continue
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        return Version(exact[0]) if len(exact) == 1 and "*" not in exact[0] else None
    return None


def edge_table_releases(readme: str) -> set[str]:
    """Releases named in the first cell of a markdown table row (`| 4.48.0 | ...`, bold too)."""
    found = set()
    for line in readme.splitlines():
        cells = line.strip().split("|")
        if line.strip().startswith("|") and len(cells) > 2:
            found.add(cells[1].strip().strip("*`").strip())
    return found


def corpus_problems(root: Path, name: str) -> list[str]:
    """What is inconsistent between a corpus repro's truth, pins and README (empty: nothing)."""
    repro = load(root, name)
    truth = repro.spec.truth
    if truth is None:
        return [f"{name} has no [truth]"]
    package = truth.package
    problems = []
    if not any(
        canonicalize_name(Requirement(p).name) == canonicalize_name(package)
        for p in repro.spec.env.pins
    ):
        problems.append(f"[env] pins do not pin {package}")
    bad_from = Version(truth.first_bad)
    fixed_from = Version(truth.first_fixed) if truth.first_fixed else None

    def broken_range(version: Version) -> bool:
        return version >= bad_from and (fixed_from is None or version < fixed_from)

    for variant, must_be_broken in (("broken", True), ("fixed", False)):
        if variant not in repro.spec.variants:
            problems.append(f"no variant {variant!r}")
            continue
        release = pinned_release(repro, variant, package)
        if release is None:
            problems.append(f"variant {variant!r} pins no exact release of {package}")
        elif must_be_broken and not broken_range(release):
            problems.append(f"variant 'broken' pins {package} {release}, outside the bad range")
        elif not must_be_broken and broken_range(release):
            problems.append(f"variant 'fixed' pins {package} {release}, inside the bad range")
        elif not must_be_broken and not (
            (truth.last_good and release <= Version(truth.last_good))
            or (fixed_from and release >= fixed_from)
        ):
            problems.append(f"variant 'fixed' pins {package} {release}, between the edges")
    readme = repro.dir / "README.md"
    if not readme.is_file():
        problems.append("no README.md with the edge table")
    else:
        shown = edge_table_releases(readme.read_text())
        for edge in ("last_good", "first_bad", "last_bad", "first_fixed"):
            release = getattr(truth, edge)
            if release and release not in shown:
                problems.append(f"README.md's table has no row for {edge} {release}")
    return problems


def test_the_corpus_is_not_empty() -> None:
    assert len(CORPUS) >= 2, CORPUS


@pytest.mark.parametrize("name", CORPUS)
def test_a_corpus_repro_agrees_with_its_truth(name: str) -> None:
    assert corpus_problems(ROOT, name) == []


TRUTH = """
[truth]
package = "transformers"
last_good = "4.47.1"
first_bad = "4.48.0"
first_fixed = "4.48.1"
symptom = "metric"
verified = "reprobox sweep x --package transformers --range '>=4.47.0,<=4.48.2'"
"""
TABLE = """| transformers | verdict |
|---|---|
| 4.47.1 | clean |
| **4.48.0** | reproduced |
| 4.48.1 | clean |
"""


def corpus_entry(root: Path, body: str, readme: str | None = TABLE) -> list[str]:
    folder = root / "repros" / "x"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "x.py").write_text("")
    (folder / "repro.toml").write_text(body)
    if readme is not None:
        (folder / "README.md").write_text(readme)
    return corpus_problems(root, "x")


SPEC = """
[repro]
title = "x"
upstream = "https://github.com/o/r/issues/1"
script = "x.py"
[launch]
launcher = "python"
processes = 1
timeout = 60
[env]
python = "3.11"
pins = ["torch==2.13.0", "transformers==4.48.0"]
[verdict]
reproduced_if = [{ metric = "m", above = 0.0 }]
[variants.broken]
expect = "reproduced"
[variants.fixed]
expect = "clean"
pins = ["transformers==4.48.1"]
"""


def test_the_check_catches_each_inconsistency(scratch_root: Path) -> None:
    """The consistency check can fail: each broken entry is named, a right one passes."""
    assert corpus_entry(scratch_root, SPEC + TRUTH) == []
    cases = [
        (SPEC.replace('"transformers==4.48.1"', '"transformers==4.48.0"'), "inside the bad"),
        (SPEC.replace('"transformers==4.48.1"', '"transformers==4.47.1"'), None),
        (SPEC.replace('"transformers==4.48.0"]', '"transformers==4.48.1"]'), "outside the bad"),
        (SPEC.replace('"transformers==4.48.0"]', '"transformers>=4.48"]'), "no exact release"),
        (SPEC.replace(', "transformers==4.48.0"', ""), "do not pin transformers"),
        (SPEC.replace("[variants.fixed]", "[variants.after]"), "no variant 'fixed'"),
    ]
    for body, message in cases:
        problems = corpus_entry(scratch_root, body + TRUTH)
        if message is None:
            assert problems == [], body
        else:
            assert any(message in p for p in problems), (message, problems)
    no_row = corpus_entry(scratch_root, SPEC + TRUTH, TABLE.replace("| 4.48.1 |", "| 4.48.2 |"))
    assert no_row == ["README.md's table has no row for first_fixed 4.48.1"]
    assert corpus_entry(scratch_root, SPEC + TRUTH, TABLE.replace("| 4.47.1", "4.47.1 |")) == [
        "README.md's table has no row for last_good 4.47.1"
    ]
    (scratch_root / "repros" / "x" / "README.md").unlink()
    assert corpus_entry(scratch_root, SPEC + TRUTH, None) == ["no README.md with the edge table"]
    # no fix released: the fixed variant stays at the last good release
    unfixed = TRUTH.replace('first_fixed = "4.48.1"\n', "")
    fixed_at_last_good = SPEC.replace('"transformers==4.48.1"', '"transformers==4.47.1"')
    assert corpus_entry(scratch_root, fixed_at_last_good + unfixed) == []
    assert any(
        "inside the bad range" in p
        for p in corpus_entry(scratch_root, SPEC.replace("4.48.1", "4.49.0") + unfixed)
    )


@pytest.mark.nightly
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", CORPUS)
def test_corpus_default_variants_give_their_expected_verdicts(
    name: str, default_runs: Callable[[str], SharedRun]
) -> None:
    """`reprobox run NAME` on a corpus repro: every default variant's expected verdict, the
    broken one at the release its lock pins."""
    expected = expected_cells(name)
    done = default_runs(name)
    records = newest_records(done.results, name)
    assert set(records) == set(expected), done.stderr
    for label, (expect, accepted) in expected.items():
        record = records[label]
        shown = (label, record["status"], record["verdict"], record.get("reason"))
        assert record["status"] == "match", shown
        assert record["verdict"] in accepted, (*shown, expect)
    assert done.returncode == ExitCode.OK, done.stderr
    repro = load(ROOT, name)
    assert repro.spec.truth is not None
    package = repro.spec.truth.package
    ran = records["broken"]["result"].get("versions", {}).get(package)
    assert ran is None or Version(ran) == pinned_release(repro, "broken", package), ran
