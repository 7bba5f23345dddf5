"""The placeholders `reprobox new` writes, and the one check that none is left.

A scaffold runs both ways before any edit, so nothing stops a report of it: a title that
says "what goes wrong, in one line", a link to `github.com/OWNER/REPO/issues/NUMBER`,
variants described "(replace with the bug)". `new` writes these strings and `report`
refuses a repro that still holds one, naming them, from this one list.
"""

from __future__ import annotations

from reprobox.core.spec import ReproFile

TITLE = ": what goes wrong, in one line"  # after the repro's name
UPSTREAM = "https://github.com/OWNER/REPO/issues/NUMBER"
HINT = "(replace with"  # in a variant's description: "(replace with the bug)"


def placeholders(spec: ReproFile) -> list[str]:
    """Where `spec` still holds what `reprobox new` wrote: `repro.title`, `repro.upstream`,
    `variants.NAME.description`."""
    found = []
    if spec.repro.title.endswith(TITLE):
        found.append("repro.title")
    if spec.repro.upstream == UPSTREAM or "OWNER/REPO" in spec.repro.upstream:
        found.append("repro.upstream")
    found += [
        f"variants.{name}.description"
        for name, variant in spec.variants.items()
        if HINT in variant.description
    ]
    return found
