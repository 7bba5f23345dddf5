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


Resolve = Callable[[dict[str, str]], dict[str, str]]


def _newest(pins: dict[str, str]) -> dict[str, str]:
    """A resolver whose every choice goes: a floating package takes its range's top."""
    return {n: v.rsplit("<=", 1)[-1] if v.startswith(">") else v for n, v in pins.items()}


class Fake:
    """Probes whose verdict is `rule(pins, attempt)` (a string: the launch fails with it);
    each run is counted. `resolve` stands in for the resolver: a step's exact versions, its
    ranges (a package left floating) chosen."""

    def __init__(
        self, rule: Callable[..., Verdict | str | None], resolve: Resolve = _newest
    ) -> None:
        self.rule, self.resolve = rule, resolve
        self.runs: list[tuple[Step, int]] = []

    def run(self, step: Step, attempt: int) -> Outcome:
        self.runs.append((step, attempt))
        verdict = self.rule(self.versions(step), attempt)
        if verdict is None:
            return Outcome("skip", reason="cannot install: no solution", wall_s=0.1)
        if isinstance(verdict, Verdict):
            return Outcome("verdict", verdict, wall_s=1.0)
        return Outcome("error", reason=verdict, wall_s=1.0)

    def versions(self, step: Step) -> dict[str, str]:
        return self.resolve(dict(step))

    @property
    def probes(self) -> Probes[Step]:
        env_key = lambda step: repr(sorted(self.versions(step).items()))  # noqa: E731
        return Probes(run=self.run, env_key=env_key, versions=self.versions)


def _details(summary: BisectSummary) -> AttributionDetails:
    """An attribution's own fields (the summary's tagged `details`)."""
    assert isinstance(summary.details, AttributionDetails), summary.details
    return summary.details


def _ask(
    tmp_path: Path,
    rule: Callable[..., Verdict | str | None],
    start: dict[str, str] = START,
    end: dict[str, str] = END,
    *,
    resolve: Resolve = _newest,
    index: FakeIndex = INDEX,
) -> tuple[BisectSummary, Fake]:
    fake = Fake(rule, resolve)
    target = hist_target(tmp_path)
    summary = attribute(
        target, start, end, labels=("a.txt", "b.txt"), index=index,
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

    def resolver(pins: dict[str, str]) -> dict[str, str]:
        chosen = _newest(pins)  # but a floating gamma backs off to 1.3 beside beta 1.0
        if pins["gamma"].startswith(">") and chosen["beta"] == "1.0":
            chosen["gamma"] = "1.3"
        return chosen

    summary, _ = _ask(tmp_path / "hidden", hidden, resolve=resolver)
    # gamma's change cannot be tested alone, but its releases can, beta left to the
    # resolver (2.0 throughout): gamma's edge is its own, and beta's moved gamma to 2.0
    assert (summary.status, summary.package, summary.first) == ("found", "gamma", "2.0")
    assert _details(summary).culprit == ["beta 1.0 -> 2.0", "gamma 1.0 -> 2.0"]
    assert _details(summary).held == {"beta": "2.0"}

    # where no release of either tells them apart, both are named, as a set, no release
    summary, _ = _ask(tmp_path / "hidden-all", hidden, resolve=lambda pins: {
        **_newest(pins), **{n: "1.0" for n, v in pins.items() if v.startswith(">")},
    })  # fmt: skip
    assert summary.status == "ambiguous" and summary.package is None
    assert _details(summary).culprit == ["beta 1.0 -> 2.0", "gamma 1.0 -> 2.0"]
    assert summary.result.startswith("culprit among: beta 1.0 -> 2.0 together with gamma")


# The shape of transformers 5 and huggingface-hub 1: `tf` from 5.0rc0 on needs `hub` >= 1.0,
# and 4.0 refuses it, so neither's change installs alone; the flip is tf's own, at 5.0rc1.
PAIR_START, PAIR_END = (
    {"tf": "4.0", "hub": "0.9", "x": "1.0"},
    {"tf": "5.0", "hub": "1.2", "x": "1.1"},
)
PAIR_INDEX = FakeIndex({
    "tf": [Release(Version(v)) for v in ("4.0", "5.0rc0", "5.0rc1", "5.0")],
    "hub": [Release(Version(v)) for v in ("0.9", "1.0", "1.1", "1.2")],
    "x": [Release(Version(v)) for v in ("1.0", "1.1")],
})  # fmt: skip


def _new_tf(version: str) -> bool:
    return Version(version) >= Version("5.0rc0")


def _pair_resolve(pins: dict[str, str]) -> dict[str, str]:
    """The resolver: a floating hub takes the newest its tf allows, a floating tf the newest
    final release its hub allows; exact pins that do not go together stay as they are (the
    rule skips them: no solution)."""
    chosen = dict(pins)
    if chosen["hub"].startswith(">"):
        chosen["hub"] = "1.2" if _new_tf(chosen["tf"]) else "0.9"
    if chosen["tf"].startswith(">"):
        chosen["tf"] = "5.0" if Version(chosen["hub"]) >= Version("1.0") else "4.0"
    return chosen


def _pair_rule(broken_from: str, failing: tuple[str, ...] = ()) -> Rule:
    def rule(pins: dict[str, str], attempt: int) -> Verdict | str | None:
        if _new_tf(pins["tf"]) != (Version(pins["hub"]) >= Version("1.0")):
            return None  # no solution: tf 5 needs hub 1, tf 4 refuses it
        if pins["tf"] in failing:
            return "ValueError: Your setup doesn't support bf16"
        return R if Version(pins["tf"]) >= Version(broken_from) else C

    return rule


def test_a_pair_that_installs_only_together_is_told_apart_by_a_release_between(
    tmp_path: Path,
) -> None:
    summary, _ = _ask(
        tmp_path, _pair_rule("5.0rc1"), PAIR_START, PAIR_END,
        resolve=_pair_resolve, index=PAIR_INDEX,
    )  # fmt: skip
    details = _details(summary)
    assert (summary.status, summary.package, summary.first) == ("found", "tf", "5.0rc1")
    assert summary.last_start == "5.0rc0" and details.held == {"hub": "1.2"}
    assert details.culprit == ["hub 0.9 -> 1.2", "tf 4.0 -> 5.0"]
    # hub's own edge moved tf too; tf's held hub: the flip is tf's
    assert details.split_tries == [
        "hub: its edge 0.9 -> 1.0 moved tf 4.0 -> 5.0 too",
        "tf: its edge 5.0rc0 -> 5.0rc1 with hub at 1.2 on both sides",
    ]
    assert summary.result.startswith(
        "culprit: tf 5.0rc1 (its release flips broken from clean to reproduced with hub at "
        "1.2 on both sides of it; hub 0.9 -> 1.2 and tf 4.0 -> 5.0 could only be installed "
        "together; 3 packages differ between the ends; "
    )

    # a package both sides install that moved at tf's edge too: the edge is not tf's alone
    def with_dep(pins: dict[str, str]) -> dict[str, str]:
        chosen = _pair_resolve(pins)
        return {**chosen, "dep": "2" if Version(chosen["tf"]) >= Version("5.0rc1") else "1"}

    summary, _ = _ask(
        tmp_path / "dep", _pair_rule("5.0rc1"), PAIR_START, PAIR_END,
        resolve=with_dep, index=PAIR_INDEX,
    )  # fmt: skip
    assert summary.status == "ambiguous" and summary.package is None
    assert "tf: its edge 5.0rc0 -> 5.0rc1 moved dep 1 -> 2 too" in _details(summary).split_tries

    # a flip that needs both (tf's release and hub's) is never split: ambiguous, as before
    def both(pins: dict[str, str], attempt: int) -> Verdict | None:
        if _new_tf(pins["tf"]) != (Version(pins["hub"]) >= Version("1.0")):
            return None
        return R if pins["tf"] == "5.0" and pins["hub"] == "1.2" else C

    summary, _ = _ask(
        tmp_path / "both", both, PAIR_START, PAIR_END, resolve=_pair_resolve, index=PAIR_INDEX
    )
    # each has an edge of its own with the other held: an interaction, no one package
    assert summary.status == "ambiguous" and summary.package is None
    assert _details(summary).split_tries == [
        "hub: its edge 1.1 -> 1.2 with tf at 5.0 on both sides",
        "tf: its edge 5.0rc1 -> 5.0 with hub at 1.2 on both sides",
    ]


def test_a_pair_whose_releases_between_fail_stays_among_with_each_try_said(
    tmp_path: Path,
) -> None:
    """sft_default_dtype's shape: the releases that would split the pair cannot run the
    script (transformers 5.0.0rc0 and rc1 with trl 0.19.1 on CPU), so the pair stays named
    together, and the line says what each try found."""
    summary, _ = _ask(
        tmp_path, _pair_rule("5.0rc1", failing=("5.0rc0", "5.0rc1")), PAIR_START, PAIR_END,
        resolve=_pair_resolve, index=PAIR_INDEX,
    )  # fmt: skip
    tries = _details(summary).split_tries
    assert summary.status == "ambiguous" and summary.package is None and summary.first is None
    assert tries[0] == "hub: its edge 0.9 -> 1.0 moved tf 4.0 -> 5.0 too"
    assert tries[1].startswith("tf: probe hub floated,tf==5.0rc0 failed (ValueError")
    assert summary.result.startswith(
        "culprit among: hub 0.9 -> 1.2 together with tf 4.0 -> 5.0 (their changes together "
        "flip broken from clean to reproduced; a smaller set could not be installed to test; "
        "hub: its edge 0.9 -> 1.0 moved tf 4.0 -> 5.0 too; tf: probe hub floated,tf==5.0rc0 "
    )


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
