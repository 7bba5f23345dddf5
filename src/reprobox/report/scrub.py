"""The scrubber as reports use it; it lives in `core.scrub`, where records and run logs
(which `report` cannot reach below) are scrubbed by the same rules."""

from __future__ import annotations

from reprobox.core.scrub import REDACTED, Scrubber, hide_url_credentials, looks_secret

__all__ = ["REDACTED", "Scrubber", "hide_url_credentials", "looks_secret"]
