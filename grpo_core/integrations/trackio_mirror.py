"""Mirror a run into Trackio (Hugging Face's local-first tracker), for people whose dashboards live there.

`log.trackio = "<project>"`: the embedded trainer logs every step's scalars (names.py's names;
`train/reward` and `frac_reward_zero_std` are TRL's names too, so TRL runs logged with
`report_to="trackio"` chart beside ours) to a trackio run named after our run id, in that
project. Health alerts become trackio alerts (WARN, ERROR when critical); applied changes
(weights, threshold, difficulty) INFO alerts; other events are not mirrored.

Where: trackio's own settings decide. Local by default (<TRACKIO_DIR>/<project>.db, TRACKIO_DIR
defaulting to ~/.cache/huggingface/trackio; see it with `trackio show --project <project>`);
TRACKIO_SPACE_ID or TRACKIO_SERVER_URL send it to a Space or a server instead. A resumed run
(--resume) mirrors into a new trackio run of the same name (trackio keeps both, told apart by
their ids).

The store stays the source of truth; the mirror is a copy that may lag or fail without touching
training: an error trackio raises, a warning it gives about a failed write during our calls, or
rows missing at finish() disables the mirror (recorded in `self.error`, warned once). trackio
prints to stdout; that goes to this module's logger. trackio is imported only when a mirror is
created.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sqlite3
import warnings
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.runs.store import EV_ALERT, EV_CHANGE

logger = logging.getLogger(__name__)
FAILED_WRITE = ("failed", "could not", "error")  # words of trackio's warnings about a lost write


class TrackioMirror:
    def __init__(self, project: str, run_id: str, config: dict | None = None):
        if not project or not project.strip():
            raise ConfigError("log.trackio must be a trackio project name (or '' for no mirror)")
        try:
            import trackio  # lazy: only runs that mirror pay for it
        except ImportError:
            raise ConfigError("log.trackio needs the trackio package: pip install trackio "
                              "(the wheel's [trackio] extra)") from None
        self._trackio, self.project, self.run_id = trackio, project, run_id
        self.error: str | None = None
        self.run = None
        self._last_event = 0  # the last store event mirrored (stored_step)
        self._steps = 0  # steps handed to trackio (finish() checks they landed)
        self._call(lambda: self._open(config or {}))

    def _open(self, config: dict):
        from trackio.utils import TRACKIO_DIR
        self.directory = Path(TRACKIO_DIR)
        self.run = self._trackio.init(
            project=self.project, name=self.run_id, resume="never", embed=False,
            auto_log_cpu=False, auto_log_gpu=False,  # our steps, not a system monitor's samples
            config={**config, "grpo_health": {"run_id": self.run_id, "mirror": 1}})
        if self.run._is_local:  # trackio writes from a thread and only warns when it cannot: fail here instead
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK):
                raise PermissionError(f"{self.directory} is not writable")

    # ---- the calls the trainer makes -------------------------------------------------------------
    def log_step(self, step: int, scalars: dict):
        """One step's scalars (names.py names) at our step."""
        if self.run is None:
            return
        data = {k: float(v) for k, v in scalars.items() if v is not None}
        self._call(lambda: self.run.log(data, step=step))
        self._steps += self.run is not None

    def stored_step(self, store, step: int, scalars: dict, groups=None, rollouts=None):
        """The embedded trainer's step just stored, and the alerts and changes stored since the
        last one (read back from the store: the mirror shows what readers see)."""
        self.log_step(step, scalars)
        ev = store.events(since_id=self._last_event, kinds=[EV_CHANGE, EV_ALERT])
        for kind, payload, at in zip(ev["kind"], ev["payload"], ev["step"]):
            self.event(kind, payload, None if at != at else int(at))
        if len(ev):
            self._last_event = int(ev["id"].iloc[-1])

    def event(self, kind: str, payload: dict, step: int | None = None):
        """A store event as a trackio alert: health alerts and applied changes."""
        if self.run is None or kind not in (EV_ALERT, EV_CHANGE):
            return
        text = payload.get("message") or json.dumps(payload.get("request", payload), default=str)[:1000]
        levels = self._trackio.AlertLevel
        if kind == EV_ALERT:
            title = f"GRPO health: {payload.get('kind', 'alert')} at step {step}"
            level = levels.ERROR if payload.get("severity") == "critical" else levels.WARN
        else:
            title, level = f"{payload.get('kind', 'change')} applied at step {step}", levels.INFO
        self._call(lambda: self.run.alert(title=title, text=text, level=level, step=step))

    def finish(self):
        """Close the trackio run (trackio flushes its queue), then check every step landed."""
        if self.run is None:
            return
        run, self.run = self.run, None
        self._call(lambda: self._close(run), run)
        if self.error is None and run._is_local:
            stored = stored_steps(self.directory, self.project, run.id)
            if stored is not None and stored < self._steps:
                self._fail(f"trackio stored {stored} of the {self._steps} steps mirrored (see its warnings)")

    # ---- helpers ---------------------------------------------------------------------------------
    def _close(self, run):
        """Finish the trackio run; it is no longer trackio's current run (else trackio's exit hook
        finishes it again)."""
        try:
            run.finish()
        finally:
            if self._trackio.context_vars.current_run.get() is run:
                self._trackio.context_vars.current_run.set(None)

    def _call(self, fn, run=None):
        """fn(), with trackio's stdout to the log; an error it raises or a failed write it warns
        about disables the mirror, never the run."""
        out = io.StringIO()
        try:
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
                warnings.simplefilter("always")
                fn()
        except Exception as e:  # noqa: BLE001 - a trackio failure must never stop training
            self._fail(f"{type(e).__name__}: {e}", run)
            return
        finally:
            for line in out.getvalue().splitlines():
                logger.info("trackio: %s", line.strip())
        for w in caught:
            message = str(w.message)
            if f"{os.sep}trackio{os.sep}" in w.filename and any(word in message for word in FAILED_WRITE):
                self._fail(message, run)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def _fail(self, error: str, run=None):
        if self.error is not None:
            return
        self.error = error
        warnings.warn(f"Trackio mirror disabled after an error: {error}", RuntimeWarning, stacklevel=4)
        run = run or self.run
        self.run = None
        if run is not None:
            with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
                self._close(run)


class Mirrors:
    """Several mirrors fed as one: the trainer's two calls go to each, in order."""

    def __init__(self, *mirrors):
        self.mirrors = mirrors

    def stored_step(self, store, step: int, scalars: dict, groups, rollouts):
        for mirror in self.mirrors:
            mirror.stored_step(store, step, scalars, groups, rollouts)

    def finish(self):
        for mirror in self.mirrors:
            mirror.finish()


def together(*mirrors):
    """The mirrors that are on (None: off) as one: None, the one, or Mirrors."""
    on = [m for m in mirrors if m is not None]
    return None if not on else on[0] if len(on) == 1 else Mirrors(*on)


def stored_steps(directory: Path, project: str, run_id: str) -> int | None:
    """How many steps of trackio run `run_id` the project's db holds (None: cannot tell)."""
    from grpo_core.integrations.trackio_source import project_file
    db = directory / project_file(project)
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
            return conn.execute("SELECT COUNT(DISTINCT step) FROM metrics WHERE run_id = ?", (run_id,)).fetchone()[0]
    except sqlite3.Error:
        return 0 if not db.exists() else None
