"""Did you mean: the one rule every unknown name goes through (a repro, a variant, a flag, a
package of `--with` or `--package`), so each says it the same way:
`unknown repro 'kll'; did you mean 'kl'?`.

difflib's ratio is enough here: the names are a handful of known words, typed by a person, and
the stdlib's matcher needs no dependency in `core` (which may import only the stdlib,
packaging and pydantic). A name with no close match lists the known ones instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's default: 'kll' -> 'kl', 'lm_heda' -> 'lm_head', 'zzz' -> nothing


def close_match(word: str, known: Iterable[str]) -> str | None:
    """The known name closest to `word`, when one is close enough (case ignored)."""
    names = list(dict.fromkeys(known))
    by_folded = {name.lower(): name for name in names}
    found = difflib.get_close_matches(word.lower(), list(by_folded), n=1, cutoff=CUTOFF)
    return by_folded[found[0]] if found else None


def hint(word: str, known: Iterable[str], listing: str = "known") -> str:
    """What follows the message about an unknown `word`: `; did you mean 'kl'?`, else
    `; known: a, b` (`listing` names that list; empty: nothing)."""
    names = list(known)
    found = close_match(word, names)
    if found is not None:
        return f"; did you mean {found!r}?"
    if not listing:
        return ""
    return f"; {listing}: {', '.join(names) or 'none'}"
