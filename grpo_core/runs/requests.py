"""Control requests: parsing, checking and sending them, and which kinds a run accepts.

A request is parsed and checked on the sending side (CLI, dashboard) by the setting it names
(live_settings), checked again and applied by the process behind the run between steps; the store
makes it exactly-once."""
from __future__ import annotations

from grpo_core.errors import ConfigError
from grpo_core.runs import live_settings
from grpo_core.runs.live_settings import (
    CHECKPOINT,
    CONTROL_KINDS,
    PAUSE,
    RESUME,
    SET_DIFFICULTY,
    SET_WEIGHTS,
    STOP,
    RequestContext,
)
from grpo_core.runs.config import TASK_LEVELS
from grpo_core.runs.run_meta import RunMeta
from grpo_core.runs.store import RunStore

MAX_REASON = 500  # characters of a request's "reason" kept (the autopilot explains each move)


def parse_cli_request(action: str, values: list[str]) -> dict:
    """The `control` verb's action and words -> an unchecked payload (the request's own parser)."""
    request = live_settings.REQUESTS.get(action.replace("-", "_"))
    if request is None:
        raise ConfigError(f"unknown action {action!r}; actions are: {', '.join(cli_actions())}")
    return request.parse_cli(values)


def cli_help() -> str:
    """The `control` command's values, one clause per setting."""
    return "; ".join(f"{s.cli}: {s.cli_values()}" for s in live_settings.SETTINGS)


def cli_actions() -> list[str]:
    return [live_settings.REQUESTS[k].cli for k in CONTROL_KINDS]


def validate_request(kind: str, payload: dict, metric_names: list[str] | None = None,
                     max_level: int = 4) -> dict:
    """Check a request; return its normalised payload or raise ConfigError naming the field.

    Any request may carry a "reason" (text, e.g. the autopilot's evidence for a move) and
    "undo_of" (the id of the request it reverts); both are kept in the payload."""
    if kind not in CONTROL_KINDS:
        raise ConfigError(f"unknown request kind {kind!r}; kinds are: {', '.join(CONTROL_KINDS)}")
    setting = live_settings.BY_KIND.get(kind)
    clean = setting.check(payload or {}, RequestContext(metric_names, max_level)) if setting else {}
    return {**clean, **annotations(payload or {})}


def annotations(payload: dict) -> dict:
    """A request's "reason" and "undo_of", checked."""
    out = {}
    reason = payload.get("reason")
    if reason is not None:
        if not isinstance(reason, str):
            raise ConfigError(f"reason must be text, got {reason!r}")
        out["reason"] = reason[:MAX_REASON]
    undo = payload.get("undo_of")
    if undo is not None:
        if isinstance(undo, bool) or not isinstance(undo, (int, float)) or undo != int(undo) or undo < 1:
            raise ConfigError(f"undo_of must be a request id (an integer >= 1), got {undo!r}")
        out["undo_of"] = int(undo)
    return out


def send(run, kind: str, payload: dict, source: str = "ui") -> int:
    """Validate against the run's metrics and write a pending request; returns its id."""
    with RunStore.open(run) as store:
        metrics = list(store.run_meta().cfg("reward", "weights", {})) or None
        clean = validate_request(kind, payload, metrics)
        return store.request(kind, clean, source=source)


# ---- which requests a run accepts (the live page shows only those controls) ----------------------
TRL_KINDS = (SET_WEIGHTS, live_settings.SET_THRESHOLD, PAUSE, RESUME, STOP, CHECKPOINT)  # integrations/trl.py applies these


def accepted_kinds(meta: dict) -> tuple[str, ...]:
    """The request kinds the process behind a run applies, from the run's meta: the built-in
    trainer takes every kind (set_difficulty only on a task with levels: demo, arithmetic), a pilot only a
    stop; the TRL callback takes weights, threshold, pause/resume, stop and checkpoint (G,
    prompts, temperature and steps are fixed in TRL's GRPOConfig, and the autopilot runs in the
    built-in trainer only); an imported run has no process behind it: none."""
    run = RunMeta.parse(meta)
    kind, source = run.kind, run.source
    if run.accepts is not None and kind != "import":  # its session's handlers (session.RunSession)
        return tuple(k for k in CONTROL_KINDS if k in run.accepts)
    # A store written before runs recorded their handlers: the rules they followed.
    if kind == "trl":
        return TRL_KINDS
    if kind == "pilot":  # a pilot changes nothing mid-way (pilot.py): only a stop applies
        return (STOP,)
    if kind == "import" or source != "grpo_core":
        return ()
    levels = TASK_LEVELS.get(run.cfg("task", "name", "demo"), 1)
    return tuple(k for k in CONTROL_KINDS if k != SET_DIFFICULTY or levels > 1)


def unsupported_note(meta: dict) -> str:
    """One line for the live page saying which controls a run lacks and why ('' when none)."""
    kind = meta.get("kind") or "train"
    if kind == "trl":
        return ("A TRL run: its callback applies reward weights, the threshold, pause/resume, stop and checkpoints. "
                "Group size, prompts per step, temperature and the step budget are fixed in TRL's GRPOConfig, it "
                "trains on a fixed dataset (no difficulty) and the autopilot runs in the built-in trainer only.")
    if kind == "art":
        return ("An ART run: its monitor applies the threshold, pause/resume and stop, and reward weights when it "
                "was started with apply_weights=True (they rewrite trajectory.reward). Group size, prompts, sampling "
                "and the step budget are the training loop's; ART saves its own checkpoints.")
    if kind == "pilot":
        return "A pilot scores the model without training it: it can only be stopped."
    if SET_DIFFICULTY not in accepted_kinds(meta) and accepted_kinds(meta):
        return "This task has no difficulty levels (the built-in demo has 4)."
    return ""
