"""The paste-able block: every variant on its own pins; the comment keeps what fits."""

from __future__ import annotations

from reprobox.report.build import COMMENT_LIMIT, _join, fit
from reprobox.report.markdown import Section
from reprobox.report.reproduce import CPU_TORCH_INDEX, install_line, pin_groups

PINS = {
    "broken": ["torch==2.13.0", "trl==0.7.1"],
    "fixed": ["torch==2.13.0", "trl==0.7.2"],
    "workaround": ["torch==2.13.0", "trl==0.7.1"],
    "control_fp32": ["torch==2.13.0", "trl==0.7.1"],
}


def _block(order: list[str]) -> list[str]:
    return pin_groups(order, lambda v: PINS[v], lambda v: f"run {v}", lambda v: "clean")


def _release_of_each(lines: list[str]) -> dict[str, str]:
    """Replay the block: which trl is installed when each variant's line runs."""
    installed: dict[str, str] = {}
    seen: dict[str, str] = {}
    for line in lines:
        if line.startswith("python3 -m venv"):
            installed = {}
        elif line.startswith("pip install"):
            installed.update(p.split("==") for p in line.split() if "==" in p)
        elif line.startswith("run "):
            seen[line.split()[1]] = installed["trl"]
    return seen


def test_controls_run_on_their_own_release_in_any_order() -> None:
    for order in (list(PINS), ["fixed", "broken", "control_fp32", "workaround"]):
        seen = _release_of_each(_block(order))
        assert seen == {v: PINS[v][1].split("==")[1] for v in PINS}, order


def test_variants_sharing_pins_share_one_venv() -> None:
    lines = _block(list(PINS))
    assert sum(line.startswith("python3 -m venv") for line in lines) == 2
    assert lines[0] == "# broken, workaround, control_fp32"


def test_cpu_torch_comes_from_the_cpu_index() -> None:
    assert install_line(["torch==2.13.0"]) == (
        f"pip install --extra-index-url {CPU_TORCH_INDEX} torch==2.13.0"
    )
    assert CPU_TORCH_INDEX not in install_line(["torch==2.13.0"], platform="gpu")
    assert install_line(["datasets==2.21.0"]) == "pip install datasets==2.21.0"


def test_fit_drops_the_largest_file_first_and_keeps_a_small_one() -> None:
    big = Section("x" * (COMMENT_LIMIT - 1000), drop=4, stub="*big not shown*")
    small = Section("config: 1", drop=4, stub="*small not shown*")
    head = Section("head " * 100)
    kept = fit([head, big, small], COMMENT_LIMIT - 500)
    assert [s.text for s in kept] == [head.text, "*big not shown*", "config: 1"]
    assert len(_join(kept)) <= COMMENT_LIMIT


def test_a_package_built_against_the_others_installs_after_them() -> None:
    lines = pin_groups(
        ["broken"],
        lambda v: ["torch==2.13.0", "deepspeed==0.19.8", "trl==0.7.1"],
        lambda v: "run broken",
        lambda v: "reproduced",
        late=["DeepSpeed"],
    )
    assert lines[2:4] == [
        f"pip install --extra-index-url {CPU_TORCH_INDEX} torch==2.13.0 trl==0.7.1",
        "pip install --no-build-isolation deepspeed==0.19.8",
    ]


def test_fit_puts_back_what_fits_once_a_needed_file_made_the_room() -> None:
    """An environment report goes first (it is not needed to run anything); when a needed
    file must go anyway, the report that then fits again is put back."""
    head = Section("## head")
    env = Section("e" * 1000, drop=4, stub="*env omitted*")
    big = Section("x" * (COMMENT_LIMIT - 2000), drop=3, stub="*big not shown*")
    small = Section("s" * 3000, drop=3, stub="*small not shown*")
    kept = fit([head, big, small, env], COMMENT_LIMIT)
    assert [s.text for s in kept] == [head.text, "*big not shown*", small.text, env.text]
    assert [s.omitted for s in kept] == [False, True, False, False]
