"""The one rule for a count a user gives: --workers, --nodes, --max-runs, --parallelism,
--shm, --scratch (1 or more), --confirm, --verify, --ttl (0 or more).

Every layer that takes such a count from outside (the CLI's parser, a bisect's strategy, the
back-end factory, the pure searches) checks it here, so the rule and its words exist once and
a library caller hears what a command-line user would.
"""

from __future__ import annotations

from reprobox.core.errors import BadInput


def check_count(flag: str, value: int, least: int = 1) -> int:
    """`value`, or BadInput "FLAG: must be LEAST or more, not VALUE"."""
    if value < least:
        raise BadInput(f"{flag}: must be {least} or more, not {value}")
    return value
