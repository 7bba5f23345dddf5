"""What `[env] exclude_newer` may say: a moment a resolve can be pinned to, every time.

uv takes an RFC 3339 timestamp or a date; anything else ("yesterday", a duration) fails
inside uv as an environment error (exit 3, a skip for `verdict`) when it is a typo in
repro.toml: bad input, said before any resolve. A relative moment is refused too: the lock
would not regenerate identically tomorrow.
"""

from __future__ import annotations

from datetime import date, datetime

EXCLUDE_NEWER_FORMS = "a date (2026-11-30) or an RFC 3339 timestamp (2026-11-30T00:00:00Z)"


def exclude_newer_problem(value: str) -> str | None:
    """Why `value` cannot be an `exclude_newer` moment, or None. A timestamp must name its
    offset (Z or +HH:MM): one without would mean another instant on every machine."""
    text = value.strip()
    try:
        if len(text) == 10:
            date.fromisoformat(text)
            return None
        moment = datetime.fromisoformat(text)
        if "T" not in text.upper():
            raise ValueError(text)
    except ValueError:
        return f"{value!r} is not {EXCLUDE_NEWER_FORMS}"
    if moment.tzinfo is None:
        return f"{value!r} names no UTC offset; give {EXCLUDE_NEWER_FORMS}"
    return None
