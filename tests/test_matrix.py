"""Cells: the default cell, the matrix product, expectation rules, exclusions, ranges."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprobox.core import cells as matrix
from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Expectation, Verdict


def test_default_cells_are_the_default_variants(toy_root: Path) -> None:
    repro = spec.load(toy_root, "toy")
    cells = matrix.default_cells(repro)
    assert [c.variant for c in cells] == ["clean", "reproduced"]
    assert [c.label for c in cells] == ["clean", "reproduced"]
    assert cells[1].expect is Expectation.REPRODUCED


def test_matrix_product_with_expectation_rules(toy_root: Path) -> None:
    repro = spec.load(toy_root, "toy")
    cells = matrix.matrix_cells(repro)
    assert [c.label for c in cells] == [
        "clean[level=0]", "clean[level=2]", "reproduced[level=0]", "reproduced[level=2]",
    ]  # fmt: skip
    expected = {c.label: c.expect for c in cells}
    assert expected["clean[level=2]"] is Expectation.REPRODUCED  # the rule
    assert expected["clean[level=0]"] is Expectation.CLEAN  # the variant's own
    assert cells[1].call_spec() == {"repro": "toy", "variant": "clean", "level": "2"}
    assert cells[1].slug == "cpu-clean@level=2"


def test_lm_head_matrix_covers_families_and_versions(root: Path) -> None:
    repro = spec.load(root, "lm_head")
    cells = matrix.matrix_cells(repro)
    assert len(cells) == 2 * 2 * 4
    assert {dict(c.params)["model"] for c in cells} == {"gpt2", "llama", "bert", "t5"}
    assert {dict(c.packages)["transformers"] for c in cells} >= {"4.32.1", "5.24.0"}


def test_version_range_uses_the_injected_release_list(scratch_root: Path) -> None:
    from test_spec import GOOD

    from fakes import write_repro

    write_repro(scratch_root, "x", GOOD.replace('pins = ["torch==2.13.0"]',
        'pins = ["torch==2.13.0", "trl==0.7.1"]') + '[matrix]\nvariants = ["broken"]\n'
        'packages = { trl = ">=0.4.7,<0.8" }\nexclude = [{ trl = "0.6.0" }]\n'
        'expect = [{ when = { trl = ">=0.7.2" }, expect = "clean" }]\n')  # fmt: skip
    repro = spec.load(scratch_root, "x")
    calls = []

    def releases(package: str, rng: str, pre: bool, yanked: bool) -> list[str]:
        calls.append((package, rng, pre, yanked))
        return ["0.4.7", "0.6.0", "0.7.1", "0.7.2"]

    cells = matrix.matrix_cells(repro, releases)
    assert calls == [("trl", ">=0.4.7,<0.8", False, False)]
    assert [dict(c.packages)["trl"] for c in cells] == ["0.4.7", "0.7.1", "0.7.2"]
    assert [c.expect for c in cells] == [Expectation.REPRODUCED] * 2 + [Expectation.CLEAN]
    with pytest.raises(BadInput, match="no release of trl matches"):
        matrix.matrix_cells(repro, lambda *a: [])


def test_also_ok_carries_into_cells(toy_root: Path) -> None:
    repro = spec.load(toy_root, "toy")
    cell = matrix.make_cell(repro, "cannot")
    assert cell.also_ok == (Verdict.CANNOT_TEST,)
