"""Cross-package attribution (`bisect.attribute`) through the real driver pieces (prober, probe
log, ends check, ddmin, release bisect) with fake launches: a pin set's verdict is scripted
from its versions, so each test states which package's change flips it, which sets cannot
install, and which launches lie."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from bisect_fakes import C, R, hist_target
from packaging.version import Version

from fakes import FakeIndex
from reprobox.bisect.attribute import Step, attribute, read_pins
from reprobox.bisect.checks import NoisyEnds
from reprobox.bisect.prober import BisectError, Outcome, Probes
from reprobox.bisect.summary import AttributionDetails, BisectSummary
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.envs.index import Release

START = {"alpha": "1.0", "beta": "1.0", "gamma": "1.0", "same": "3.0"}
END = {"alpha": "2.0", "beta": "2.0", "gamma": "2.0", "same": "3.0"}
RELEASES = ["1.0", "1.1", "1.2", "1.3", "2.0"]
INDEX = FakeIndex({n: [Release(Version(v)) for v in RELEASES] for n in ("alpha", "beta", "gamma")})

Rule = Callable[[dict[str, str], int], Verdict | None]


class Fake:
    """Probes whose verdict is `rule(pins, attempt)`; each run is counted."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.runs: list[tuple[Step, int]] = []

    def run(self, step: Step, attempt: int) -> Outcome:
        self.runs.append((step, attempt))
        verdict = self.rule(dict(step), attempt)
        if verdict is None:
            return Outcome("skip", reason="cannot install: no solution", wall_s=0.1)
        return Outcome("verdict", verdict, wall_s=1.0)

    @property
    def probes(self) -> Probes[Step]:
        return Probes(run=self.run, env_key=lambda step: repr(step))


def _details(summary: BisectSummary) -> AttributionDetails:
    """An attribution's own fields (the summary's tagged `details`)."""
    assert isinstance(summary.details, AttributionDetails), summary.details
    return summary.details


def _ask(
    tmp_path: Path, rule: Rule, start: dict[str, str] = START, end: dict[str, str] = END
) -> tuple[BisectSummary, Fake]:
    fake = Fake(rule)
    target = hist_target(tmp_path)
    summary = attribute(
        target, start, end, labels=("a.txt", "b.txt"), index=INDEX,
        log_path=tmp_path / "log.jsonl", probes=fake.probes,
    )  # fmt: skip
    return summary, fake


def test_one_package_flips_it_and_its_release_is_named(tmp_path: Path) -> None:
    def rule(pins: dict[str, str], attempt: int) -> Verdict:
        return R if Version(pins["gamma"]) >= Version("1.2") else C

    summary, fake = _ask(tmp_path, rule)
    assert summary.status == "found" and summary.package == "gamma"
    assert summary.first == "1.2" and summary.last_start == "1.1"
    assert _details(summary).culprit == ["gamma 1.0 -> 2.0"]
    assert summary.result.startswith(
        "culprit: gamma 1.2 (its change from 1.0 to 2.0 flips broken from clean to "
        "reproduced; 3 packages differ between the ends; "
    )
    assert summary.result.endswith(
        "assuming one package's change flips it and its releases are monotone)"
    )
    # every release step holds the other packages at the first end
    for step, _ in fake.runs:
        pins = dict(step)
        if "==" in str(step) or pins["gamma"] not in ("1.0", "2.0"):
            assert (pins["alpha"], pins["beta"]) == ("1.0", "1.0")
    # the same question again: every probe from the log, none launched
    again, second = _ask(tmp_path, rule)
    assert second.runs == [] and again.launched == 0
    assert again.result.split("; ")[0] == summary.result.split("; ")[0]


def test_the_answer_says_how_to_go_on_to_the_commit(tmp_path: Path) -> None:
    def rule(pins: dict[str, str], attempt: int) -> Verdict:
        return R if Version(pins["alpha"]) >= Version("1.3") else C

    def next_step(package: str, last: str, first: str) -> str:
        return f"; on to the commit: {package} {last}..{first}"

    fake = Fake(rule)
    summary = attribute(
        hist_target(tmp_path), START, END, index=INDEX, log_path=tmp_path / "log.jsonl",
        probes=fake.probes, next_step=next_step,
    )  # fmt: skip
    assert summary.result.startswith("culprit: alpha 1.3 (its change from 1.0 to 2.0 flips")
    assert summary.result.endswith("are monotone); on to the commit: alpha 1.2..1.3")


def test_two_packages_that_flip_it_only_together_are_both_named(tmp_path: Path) -> None:
    def rule(pins: dict[str, str], attempt: int) -> Verdict:
        return R if pins["alpha"] == "2.0" and pins["beta"] == "2.0" else C

    summary, _ = _ask(tmp_path, rule)
    assert summary.status == "found" and summary.package is None
    assert _details(summary).culprit == ["alpha 1.0 -> 2.0", "beta 1.0 -> 2.0"]
    assert summary.result.startswith(
        "culprit: alpha 1.0 -> 2.0 together with beta 1.0 -> 2.0 (only their changes "
        "together flip broken from clean to reproduced; "
    )


def test_no_flip_between_the_ends_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BisectError, match="both ends are clean in 3 launches each"):
        _ask(tmp_path, lambda pins, attempt: C)


def test_a_set_that_cannot_install_is_a_skip_not_an_answer(tmp_path: Path) -> None:
    def unrelated(pins: dict[str, str], attempt: int) -> Verdict | None:
        if pins["alpha"] == "2.0" and pins["gamma"] == "1.0":
            return None  # alpha 2.0 needs gamma 2.0
        return R if pins["gamma"] != "1.0" and Version(pins["gamma"]) >= Version("1.3") else C

    summary, _ = _ask(tmp_path, unrelated)
    assert (summary.status, summary.package, summary.first) == ("found", "gamma", "1.3")
    assert any(p.skip for p in summary.probes)

    def hidden(pins: dict[str, str], attempt: int) -> Verdict | None:
        if pins["gamma"] == "2.0" and pins["beta"] == "1.0":
            return None  # gamma 2.0 needs beta 2.0: gamma's change alone cannot be tested
        return R if pins["gamma"] == "2.0" else C

    summary, _ = _ask(tmp_path / "hidden", hidden)
    # beta may not matter, but nothing measured says so: both named, as a set, no release
    assert summary.status == "ambiguous" and summary.package is None
    assert _details(summary).culprit == ["beta 1.0 -> 2.0", "gamma 1.0 -> 2.0"]
    assert summary.result.startswith("culprit among: beta 1.0 -> 2.0 together with gamma")


def test_an_end_that_lies_when_launched_again_is_named_as_noise(tmp_path: Path) -> None:
    def lying_start(pins: dict[str, str], attempt: int) -> Verdict:
        if pins == START and attempt > 1:
            return R  # the first end reproduces on its second launch
        return R if pins["gamma"] == "2.0" else C

    summary, _ = _ask(tmp_path, lying_start)
    assert summary.status == "flaky" and summary.flaky == ["from"]
    assert summary.package is None and summary.first is None
    assert summary.result.startswith("flaky: from gave another verdict when launched again")
    assert "--flaky" in summary.result

    def noisy_ends(pins: dict[str, str], attempt: int) -> Verdict:
        return C if attempt == 1 or pins == END else R  # alike at first, then not

    with pytest.raises(NoisyEnds, match=r"flaky: the ends gave different verdicts when repeated"):
        _ask(tmp_path / "ends", noisy_ends)


def test_a_fix_is_attributed_too(tmp_path: Path) -> None:
    def fixed(pins: dict[str, str], attempt: int) -> Verdict:
        return C if Version(pins["beta"]) >= Version("1.1") else R

    summary, _ = _ask(tmp_path, fixed)
    assert (summary.package, summary.first) == ("beta", "1.1")
    assert "flips broken from reproduced to clean" in summary.result


def test_equal_ends_are_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="pin the same versions"):
        _ask(tmp_path, lambda pins, attempt: C, end=START)


def test_pins_are_read_from_a_lock_or_a_freeze_file() -> None:
    lock = (
        "# reprobox-lock input=0 body=0\n# python 3.11\n#   torch==2.13.0\n"
        "torch==2.13.0+cpu \\\n    --hash=sha256:00\n    # via trl\nTyping_Extensions==4.12.2\n"
    )
    assert read_pins(lock, "a.txt") == {"torch": "2.13.0+cpu", "typing-extensions": "4.12.2"}
    assert read_pins("numpy==1.26.0\npip==24.0  # kept\n", "f") == {
        "numpy": "1.26.0",
        "pip": "24.0",
    }
    for line in ("pkg @ git+https://example.invalid/pkg@main", "-e .", "numpy>=1.0"):
        with pytest.raises(BadInput, match="is not an exact pin"):
            read_pins(f"numpy==1.26.0\n{line}\n", "f")
