"""The facts of one report (`Facts`): its cells in order, which ran, which were measured,
which show the bug, the versions each imported and the upstream issue. Every section is
written from them (`sections`, `answers`, `results`), so they live below all three.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from reprobox.bisect.summary import BisectSummary
from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.core.protocol import Verdict
from reprobox.core.records import Record
from reprobox.report import data
from reprobox.report.bundle import top_pins
from reprobox.report.files import ReportFiles

_GITHUB = re.compile(r"^https://github\.com/(?P<repo>[^/\s]+/[^/\s]+)/(?:issues|pull)/(?P<n>\d+)")


def issue_ref(url: str) -> tuple[str, int] | None:
    """`https://github.com/o/r/issues/5` -> ("o/r", 5)."""
    match = _GITHUB.match(url)
    return (match["repo"].lower(), int(match["n"])) if match else None


class Facts:
    """What one report says, from its records, summaries and the files read for it
    (`files.read_files`): pure, it reads nothing itself. `sections.Builder` writes the
    sections from it; `answers` and `results` read it."""

    def __init__(
        self,
        repro: spec.Repro,
        loaded: data.Loaded,
        files: ReportFiles,
        summaries: Sequence[BisectSummary] = (),
        posting_to: str | None = None,
    ) -> None:
        self.repro, self.files = repro, files
        self.variants = list(repro.spec.variants)
        self.records = data.order_records(loaded.records, self.variants)
        self.skipped = list(loaded.skipped)
        self.later = list(loaded.later)  # newer runs than the verdicts shown, none measured
        self.left_out = loaded.left_out
        self.summaries = list(summaries)
        self.posting_to = posting_to  # "owner/repo#N" the comment goes to
        self.not_run = [r for r in self.records if data.not_run(r)]
        self.ran = [r for r in self.records if not data.not_run(r)]
        self.defaults = [r for r in self.ran if not (r.packages or r.params)]
        self.matrix = [r for r in self.ran if r.packages or r.params]
        # cells expected `unknown` that wrote a measurement: their own section, no verdict
        self.measured = [(r, m) for r in self.ran if (m := data.measurement(r)) is not None]
        self.judged = [r for r in self.defaults if not self._is_measured(r)]
        shown = dict.fromkeys(r.variant for r in self.records if not self._is_measured(r))
        self.rules = list(dict.fromkeys(rule.metric for v in shown for rule in self._rules(v)))
        self.metrics = data.key_metrics(
            [r for r in self.ran if not self._is_measured(r)], self.rules
        )
        self.platforms = len({r.platform for r in self.records})

    # -- facts

    def _rules(self, variant: str) -> list[spec.Rule]:
        try:
            return self.repro.rules(variant)
        except BadInput:  # a variant since removed from repro.toml: the repro's rule
            return list(self.repro.spec.verdict.reproduced_if)

    def _verdict(self, variant: str) -> spec.VerdictSection:
        try:
            return self.repro.verdict(variant)
        except BadInput:  # a variant since removed from repro.toml: the repro's [verdict]
            return self.repro.spec.verdict

    def _is_measured(self, record: Record) -> bool:
        return any(r is record for r, _ in self.measured)

    def bug_record(self) -> Record | None:
        """The cell that shows the bug: the first default cell expected to reproduce (else
        the first default cell, else the first that ran)."""
        for record in self.judged:
            if record.expect == Verdict.REPRODUCED.value:
                return record
        found = self.judged or self.defaults or self.ran
        return found[0] if found else None

    def versions(self, record: Record) -> list[str]:
        """`transformers 4.32.1, torch 2.13.0+cpu`: what the repro pins exactly, as the run
        imported it; the upstream project's package first."""
        imported = {canonicalize_name(k): str(v) for k, v in versions_of(record).items()}
        pins = []
        for pin in self._pins(record.variant):
            try:
                req = Requirement(pin)
            except InvalidRequirement:
                continue
            if any(s.operator == "==" for s in req.specifier):
                pins.append(canonicalize_name(req.name))
        pins += [canonicalize_name(package) for package in record.packages]
        upstream = issue_ref(self.repro.spec.repro.upstream)
        project = canonicalize_name(upstream[0].split("/")[1]) if upstream else ""
        pins.sort(key=lambda name: name != project)
        return [f"{name} {imported[name]}" for name in dict.fromkeys(pins) if name in imported]

    def _pins(self, variant: str) -> list[str]:
        try:
            return top_pins(self.repro, variant)
        except BadInput:
            return list(self.repro.spec.env.pins)

    def _description(self, variant: str) -> str:
        found = self.repro.spec.variants.get(variant)
        return found.description if found else ""


def versions_of(record: Record) -> dict[str, str]:
    """The versions a run imported, as its result says (none when it says nothing)."""
    found = record.result.get("versions") or {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
