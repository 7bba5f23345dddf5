"""Back ends: where a launch runs (see run/backend.py for the interface)."""
