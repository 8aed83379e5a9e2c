"""The errors a user can cause: ConfigError and StoreError, at the bottom of the floor plan.

Every wing raises them; the CLI and the pages turn them into one line (never a traceback wall)."""
from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """Bad configuration or a bad request; the message names the field and the fix."""


class StoreError(RuntimeError):
    """A store that cannot be opened or used; the message says why."""


def suggest(name: str, options) -> str:
    """' (did you mean 'x'?)' for a near miss of `name` among `options`, else '': for the one-line errors."""
    near = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{near[0]}'?)" if near else ""
