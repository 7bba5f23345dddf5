"""repro.toml loading: the real repros load, and every malformation names file and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import reprobox
from fakes import repro_toml, write_repro
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode, SpecError

GOOD = repro_toml(
    title="t",
    upstream="https://example.invalid/1",
    launcher="torchrun",
    processes=2,
    timeout=10,
    python=None,
    metric="m",
    variants={"broken": "reproduced"},
)


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
    with pytest.raises(SpecError, match=r"repro.toml: not valid TOML: .*line 2"):
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
    with pytest.raises(BadInput, match=r"unknown repro 'lm_heda'; did you mean 'lm_head'\?"):
        spec.load(root, "lm_heda")


def test_variant_pins_replace_base_pins_by_package(scratch_root: Path) -> None:
    write_repro(scratch_root, "x", GOOD.replace(
        'expect = "reproduced"', 'expect = "reproduced"\npins = ["Torch==2.1.2", "trl==0.7.1"]'
    ))  # fmt: skip
    repro = spec.load(scratch_root, "x")
    assert repro.requirements("broken") == ["Torch==2.1.2", "trl==0.7.1"]
    assert repro.requirements("broken", overrides={"trl": "0.7.2"})[-1] == "trl==0.7.2"


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        # timeouts that are no timeouts
        (("timeout = 10", "timeout = nan"), "launch.timeout", "finite number (got nan)"),
        (("timeout = 10", "timeout = inf"), "launch.timeout", "finite number (got inf)"),
        (("timeout = 10", "timeout = -1"), "launch.timeout", "greater than 0 (got -1)"),
        (("timeout = 10", "timeout = 0"), "launch.timeout", "greater than 0 (got 0)"),
        (('expect = "reproduced"', 'expect = "reproduced"\nlaunch = { timeout = nan }'),
         "variants.broken.launch.timeout", "finite number"),
        # a bound on processes, said
        (("processes = 2", "processes = 100000"), "launch.processes",
         "less than or equal to 64 (got 100000)"),
        (('expect = "reproduced"', 'expect = "reproduced"\nlaunch = { processes = 65 }'),
         "variants.broken.launch.processes", "less than or equal to 64"),
        # strings are not numbers, nor booleans
        (("timeout = 10", 'timeout = "180"'), "launch.timeout", "valid number (got '180')"),
        (("processes = 2", 'processes = "2"'), "launch.processes", "valid integer (got '2')"),
        (("processes = 2", "processes = 2.0"), "launch.processes", "valid integer"),
        (("above = 0.0", 'above = "0.5"'), "verdict.reproduced_if.0.above", "valid number"),
        (("above = 0.0", "above = nan"), "verdict.reproduced_if.0.above", "finite number"),
        (('expect = "reproduced"', 'expect = "reproduced"\ndefault = "false"'),
         "variants.broken.default", "valid boolean (got 'false')"),
        (("timeout = 10", "timeout = 10\nbatch = 1"), "launch.batch", "valid boolean"),
        # paths stay inside the repro's folder and fixes/
        (('script = "script.py"', 'script = "../../../../etc/passwd"'), "repro.script",
         "'../../../../etc/passwd' is outside the repro's folder"),
        (('script = "script.py"', 'script = "/etc/hostname"'), "repro.script",
         "'/etc/hostname' is outside the repro's folder"),
        (('expect = "reproduced"', 'expect = "reproduced"\nfix = "../x"'), "variants.broken.fix",
         "'../x' is not a module name in fixes/"),
        (('expect = "reproduced"', 'expect = "reproduced"\nfix = "/etc/passwd"'),
         "variants.broken.fix", "not a module name"),
        (('launcher = "torchrun"', 'launcher = "accelerate"\nconfig = "../../x.yaml"'),
         "launch.config", "'../../x.yaml' is outside the repro's folder"),
        # names that become folders are slugs
        (("[variants.broken]", '[variants.".."]'), "variants...", "not a valid name"),
        (("[variants.broken]", '[variants."a/b"]'), "variants.a/b", "not a valid name"),
        (("[variants.broken]", '[variants."-x"]'), "variants.-x", "not a valid name"),
        (("[verdict]", '[platforms."../gpu"]\n[verdict]'), "platforms.../gpu", "not a valid name"),
        # a misspelt key names itself, with a guess
        (("timeout = 10", "timout = 180"), "launch.timout",
         "unknown field (did you mean 'timeout'?)"),
        (('expect = "reproduced"', 'expect = "reproduced"\nlaunch = { procesess = 2 }'),
         "variants.broken.launch.procesess", "unknown field (did you mean 'processes'?)"),
        (('expect = "reproduced"', 'expct = "reproduced"'), "variants.broken.expct",
         "unknown field (did you mean 'expect'?)"),
        (("[verdict]", "[verdcit]"), "verdcit", "unknown field (did you mean 'verdict'?)"),
        (("timeout = 10", "timeout = 10\nzzz = 1"), "launch.zzz", "unknown field"),
        # a warm start is the python launcher's, and names modules
        (("timeout = 10", 'timeout = 10\nfork = ["torch"]'), "launch.fork",
         "only the python launcher forks its ranks, not torchrun"),
        (('expect = "reproduced"', 'expect = "reproduced"\nlaunch = { fork = ["torch"] }'),
         "variants.broken.launch.fork", "only the python launcher forks its ranks"),
        (("timeout = 10", 'timeout = 10\nfork = ["os; rm -rf"]'), "launch.fork.0",
         "should match pattern"),
    ],
)  # fmt: skip
def test_hostile_and_mistyped_input_is_refused(
    tmp_path: Path, change: tuple[str, str], field: str, message: str
) -> None:
    directory = tmp_path / "repros" / "x"
    directory.mkdir(parents=True)
    (tmp_path / "fixes").mkdir()
    (directory / "script.py").write_text("print('hi')\n")
    assert GOOD.count(change[0]) == 1, change
    file = directory / "repro.toml"
    file.write_text(GOOD.replace(*change))
    with pytest.raises(SpecError) as raised:
        spec.load_file(file, fixes_dir=tmp_path / "fixes")
    text = str(raised.value)
    assert f"repro.toml: {field}: " in text, text
    assert message in text, text
    assert "required field is missing" not in text
    assert raised.value.exit_code == ExitCode.BAD_INPUT


def test_a_symlink_out_of_the_repro_folder_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "repros" / "x"
    directory.mkdir(parents=True)
    outside = tmp_path / "elsewhere.py"
    outside.write_text("print('hi')\n")
    (directory / "script.py").symlink_to(outside)
    (directory / "repro.toml").write_text(GOOD)
    with pytest.raises(SpecError, match=r"repro.script: 'script.py' is outside the repro's fold"):
        spec.load_file(directory / "repro.toml", fixes_dir=tmp_path / "fixes")


def test_what_is_valid_still_loads(tmp_path: Path) -> None:
    """The strict fields take what TOML gives them: an integer timeout, a float one."""
    directory = tmp_path / "repros" / "x"
    directory.mkdir(parents=True)
    (directory / "script.py").write_text("print('hi')\n")
    file = directory / "repro.toml"
    file.write_text(GOOD.replace("timeout = 10", "timeout = 0.5\nbatch = true")
                    .replace("[variants.broken]", "[variants.Broken-2_x]"))  # fmt: skip
    repro = spec.load_file(file, fixes_dir=tmp_path / "fixes")
    assert repro.spec.launch.timeout == 0.5 and repro.spec.launch.batch is True
    assert repro.default_variants == ["Broken-2_x"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -1.0, 0.0])
def test_check_timeout_refuses_what_is_no_timeout(value: float) -> None:
    with pytest.raises(BadInput, match=r"--timeout: .* finite number of seconds > 0"):
        spec.check_timeout(value, "--timeout")


def test_check_timeout_and_overrides_accept_what_is_fine() -> None:
    assert spec.check_timeout(None, "--timeout") is None
    assert spec.check_timeout(30, "--timeout") == 30.0
    spec.check_overrides(["numpy==1.26.0", "torch==2.13.0", "not a pair"])
    with pytest.raises(BadInput, match=r"--with: numpy given twice \('numpy==1.26.0' and 'Num"):
        spec.check_overrides(["numpy==1.26.0", "NumPy==1.25.0"])


@pytest.mark.parametrize(
    ("toml_change", "args", "message"),
    [
        (("timeout = 10", "timout = 180"), [],
         "repro.toml: launch.timout: unknown field (did you mean 'timeout'?)"),
        (('script = "script.py"', 'script = "/etc/hostname"'), [],
         "repro.script: '/etc/hostname' is outside the repro's folder"),
        (None, ["--timeout", "nan"], "--timeout: nan is not a timeout"),
        (None, ["--timeout", "-1"], "--timeout: -1.0 is not a timeout"),
        (None, ["--timeout", "0"], "--timeout: 0.0 is not a timeout"),
        (None, ["--with", "torch==2.13.0", "--with", "Torch==2.12.0"],
         "--with: torch given twice"),
    ],
)  # fmt: skip
def test_bad_input_through_the_cli_is_one_line_and_exit_2(
    scratch_root: Path, toml_change: tuple[str, str] | None, args: list[str], message: str
) -> None:
    write_repro(scratch_root, "x", GOOD.replace(*toml_change) if toml_change else GOOD)
    done = reprobox("run", "x", *args, timeout=120)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reprobox: error: "), done.stderr
    assert message in lines[0], lines[0]
    assert not (scratch_root / "results").exists()  # refused before anything ran


TRUTH = """
[truth]
package = "transformers"
last_good = "4.47.1"
first_bad = "4.48.0"
first_fixed = "4.48.1"
reported_in = "trl"
symptom = "metric"
verified = "every release from 4.47.0 to 4.48.2, one launch each"
"""


def test_a_corpus_repro_carries_its_truth_and_its_own_nox_tag(scratch_root: Path) -> None:
    """A `[truth]` makes a corpus repro: its default cell is tagged `corpus`, never `default`
    (`make repro` keeps the three product repros), and its edges are in order."""
    from reprobox.scaleout import noxview

    write_repro(scratch_root, "x", GOOD + TRUTH)
    repro = spec.load(scratch_root, "x")
    assert repro.corpus and repro.spec.truth is not None and repro.spec.truth.cross_package
    assert noxview.session_cells(scratch_root, "x")[1][0].tags == [noxview.CORPUS_TAG]
    write_repro(scratch_root, "y", GOOD)
    assert not spec.load(scratch_root, "y").corpus
    assert noxview.session_cells(scratch_root, "y")[1][0].tags == [noxview.DEFAULT_TAG]
    broken = [
        (('first_fixed = "4.48.1"', 'first_fixed = "4.47.0"'), "last_good < first_bad"),
        (('first_bad = "4.48.0"', 'first_bad = "4.48.x"'), "'4.48.x' is not a release"),
        (('symptom = "metric"', 'symptom = "slow"'), "truth.symptom"),
        (('reported_in = "trl"', "open = true"), "open = true says no release fixed it"),
        (('reported_in = "trl"', 'last_bad = "4.48.1"'), "first_bad <= last_bad < first_fixed"),
        (('reported_in = "trl"', 'last_bad = "4.47.0"'), "first_bad <= last_bad < first_fixed"),
        (('first_fixed = "4.48.1"', 'last_bad = "4.48.0"'), "last_bad is the release before"),
    ]
    for change, message in broken:
        write_repro(scratch_root, "x", GOOD + TRUTH.replace(*change))
        with pytest.raises(SpecError, match=re.escape(message)):
            spec.load(scratch_root, "x")
