"""The errors a user can cause (ConfigError, StoreError) and any error as one line: the bottom of the floor plan.

Every wing raises them; the CLI and the pages turn them into one line (never a traceback wall).
one_line and exception_line are that line's one definition: a run's stored error, what `train`
prints and what every page shows (a traceback goes to the run's log: runs/failure.py)."""
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


# The exceptions a user's input causes: the CLI answers them with their one line and exit code 2.
USER_ERRORS = (ConfigError, StoreError, FileNotFoundError)
TRACEBACK_HEAD = "Traceback (most recent call last)"
MAX_LINE = 500  # an error message can be one very long line (a dict, a tensor): still a line on a page


def one_line(text) -> str:
    """The line of `text` that names an error ('' for none): a traceback's last non-empty line
    (Python prints the exception last, and older stores kept meta.error as a whole traceback),
    else the first non-empty line; at most MAX_LINE characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] if isinstance(text, str) else []
    if not lines:
        return ""
    line = lines[-1] if TRACEBACK_HEAD in text else lines[0]
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 1] + "…"


def exception_line(error: BaseException) -> str:
    """An exception as one line: a user error's own message (it names the field and the fix), else
    its type and its message's line, e.g. 'RuntimeError: Engine core initialization failed'. A
    message that carries a whole traceback (a subprocess's, an engine's) gives that one's last line."""
    text = one_line(str(error))
    if isinstance(error, (ConfigError, StoreError)) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
