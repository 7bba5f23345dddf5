"""The stack's own environment reports, cut to what a maintainer reads in a comment.

`transformers env` asks the reporter to "FILL OUT the two last points" and leaves
`<fill in>` in them: pasted as is, a placeholder reads as if the reporter forgot something,
and the comment already says how the run was set up (ranks, backend, device). `ds_report`
prints log lines and raw `[WARNING]` lines (a missing libaio, the CPU accelerator chosen)
around its op table: the table's `[NO]` already says what the warning says. Both are cut
here, and only here, with one rule per report.
"""

from __future__ import annotations

import re

# The "Copy-and-paste the text below ..." preamble of transformers / accelerate / trl env.
_PREAMBLE = re.compile(r"^\s*Copy-and-paste\b", re.IGNORECASE)
# A line the reporter is asked to fill in: `- Using GPU in script?: <fill in>`.
_PLACEHOLDER = re.compile(r"<\s*fill[ _-]?in\s*>", re.IGNORECASE)
# ds_report's noise: logging lines (`[2026-12-02 04:18:41,246] [WARNING] [...]`) and the
# op builders' raw warnings (` [WARNING]  async_io requires the dev libaio ...`).
_LOG_LINE = re.compile(r"^\s*\[\d{4}-\d\d-\d\d[ T][0-9:,.]+\]\s*\[[A-Z]+\]")
_WARNING = re.compile(r"^\s*\[(WARNING|INFO|DEBUG)\]")
_RULE = re.compile(r"^-{10,}$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # ds_report colours [OKAY] and [NO]
# accelerate / trl env put a value a tab away or on a tab-indented line of its own:
# `- Accelerate config: \tnot found`, `- `Accelerate` default config:` + `\tNot found`.
_TAB_VALUE = re.compile(r":[ ]*\t+[ \t]*")
_NOT_FOUND = re.compile(r"^\s+not found\s*$", re.IGNORECASE)


def trim_stack_report(title: str, text: str) -> str:
    """`text` of the report named `title` (`transformers env`, `ds_report`, ...) without
    its preamble, placeholders, colours and raw warnings."""
    text = _ANSI.sub("", text)
    if title.split()[0] == "ds_report":
        return _trim_ds_report(text)
    lines: list[str] = []
    for line in text.splitlines():
        if _PREAMBLE.match(line) or _PLACEHOLDER.search(line):
            continue
        line = _TAB_VALUE.sub(": ", line)
        if _NOT_FOUND.match(line) and lines and lines[-1].endswith(":"):
            lines[-1] += " not found"  # `- Accelerate default config:` + `\tNot found`
            continue
        lines.append(line)
    return "\n".join(lines).strip()


def _trim_ds_report(text: str) -> str:
    """The op table and the general environment info; no log line, no warning, no NOTE
    paragraph about JIT compilation, one rule between blocks."""
    out: list[str] = []
    in_note = False
    for line in text.splitlines():
        if _LOG_LINE.match(line) or _WARNING.match(line):
            continue
        if line.startswith("NOTE:"):
            in_note = True
            continue
        if in_note and line.startswith(" "):
            continue
        in_note = False
        if _RULE.match(line.strip()) and (not out or _RULE.match(out[-1])):
            continue  # a rule at the top, or right after another one
        out.append(line.rstrip())
    while out and _RULE.match(out[-1]):
        out.pop()
    return "\n".join(out).strip()
