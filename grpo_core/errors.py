"""The errors a user can cause: ConfigError and StoreError, at the bottom of the floor plan.

Every wing raises them; the CLI and the pages turn them into one line (never a traceback wall)."""
from __future__ import annotations


class ConfigError(ValueError):
    """Bad configuration or a bad request; the message names the field and the fix."""


class StoreError(RuntimeError):
    """A store that cannot be opened or used; the message says why."""
