"""repro.toml loading: the real repros load, and every malformation names file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import write_repro
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode, SpecError

GOOD = """
[repro]
title = "t"
upstream = "https://example.invalid/1"
script = "script.py"

[launch]
launcher = "torchrun"
processes = 2
timeout = 10

[env]
pins = ["torch==2.13.0"]

[verdict]
reproduced_if = [{ metric = "m", above = 0.0 }]

[variants.broken]
expect = "reproduced"
"""


def test_real_repros_load(root: Path) -> None:
    names = spec.discover(root)
    assert "lm_head" in names
    for name in names:
        repro = spec.load(root, name)
        assert repro.default_variants, name


def test_minimal_repro_loads(scratch_root: Path) -> None:
    write_repro(scratch_root, "x", GOOD)
    repro = spec.load(scratch_root, "x")
    assert repro.default_variants == ["broken"]
    assert repro.launch("broken").processes == 2


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (('launcher = "torchrun"', 'launcher = "mpirun"'), "launch.launcher", "torchrun"),
        (('expect = "reproduced"', 'description = "no expectation"'), "variants.broken.expect",
         "required field is missing"),
        (('pins = ["torch==2.13.0"]', 'pins = ["torch=2.13.0"]'), "env.pins[0]",
         "bad requirement"),
        (('processes = 2', 'processes = 0'), "launch.processes", "greater than or equal"),
        (('timeout = 10', 'timeout = 10\nretries = 3'), "launch.retries", "unknown field"),
        (('expect = "reproduced"', 'expect = "reproduced"\nfix = "nope"'), "variants.broken.fix",
         "fix module 'nope' not found"),
        (('script = "script.py"', 'script = "missing.py"'), "repro.script", "not found"),
        (('expect = "reproduced"', 'expect = "broken"'), "variants.broken.expect",
         "'clean', 'reproduced'"),
    ],
)  # fmt: skip
def test_malformed_fields_name_file_and_field(
    scratch_root: Path, change: tuple[str, str], field: str, message: str
) -> None:
    write_repro(scratch_root, "x", GOOD.replace(*change))
    with pytest.raises(SpecError) as raised:
        spec.load(scratch_root, "x")
    text = str(raised.value)
    assert "repro.toml" in text
    assert field in text
    assert message in text
    assert raised.value.exit_code == ExitCode.BAD_INPUT


def test_invalid_toml_names_the_line(scratch_root: Path) -> None:
    write_repro(scratch_root, "x", GOOD.replace('title = "t"', "title = "))
    with pytest.raises(SpecError, match=r"repro.toml: not valid TOML: .*line 3"):
        spec.load(scratch_root, "x")


def test_matrix_axes_are_checked(scratch_root: Path) -> None:
    write_repro(scratch_root, "x", GOOD + '[matrix]\nvariants = ["broken"]\n'
                'packages = { transformers = ["4.32.1"] }\n')  # fmt: skip
    with pytest.raises(SpecError, match=r"matrix.packages.transformers: .*not among env.pins"):
        spec.load(scratch_root, "x")
    write_repro(scratch_root, "x", GOOD + '[matrix]\nvariants = ["broken"]\n'
                'packages = { torch = ["2.13.x"] }\n')  # fmt: skip
    with pytest.raises(SpecError, match=r"matrix.packages.torch\[0\]: '2.13.x' is not a valid"):
        spec.load(scratch_root, "x")


def test_unknown_repro_suggests_a_name(root: Path) -> None:
    with pytest.raises(BadInput, match=r"unknown repro 'lm_heda' \(did you mean 'lm_head'\?\)"):
        spec.load(root, "lm_heda")


def test_variant_pins_replace_base_pins_by_package(scratch_root: Path) -> None:
    write_repro(scratch_root, "x", GOOD.replace(
        'expect = "reproduced"', 'expect = "reproduced"\npins = ["Torch==2.1.2", "trl==0.7.1"]'
    ))  # fmt: skip
    repro = spec.load(scratch_root, "x")
    assert repro.requirements("broken") == ["Torch==2.1.2", "trl==0.7.1"]
    assert repro.requirements("broken", overrides={"trl": "0.7.2"})[-1] == "trl==0.7.2"
