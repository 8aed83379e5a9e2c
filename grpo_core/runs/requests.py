"""Control requests: parsed and checked on the sending side (CLI, dashboard), checked
again and applied by the trainer between steps. The store makes them exactly-once."""
from __future__ import annotations

from grpo_core.runs import live_settings
from grpo_core.errors import ConfigError
from grpo_core.runs.config import validate_weights
from grpo_core.runs.live_settings import SET_AUTOPILOT, SET_DIFFICULTY, SET_WEIGHTS
from grpo_core.runs.store import CHECKPOINT, CONTROL_KINDS, PAUSE, RESUME, STOP, RunMeta, RunStore

ON_OFF = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
MAX_REASON = 500  # characters of a request's "reason" kept (the autopilot explains each move)


def parse_cli_request(action: str, values: list[str]) -> dict:
    kind = action.replace("-", "_")
    if kind == SET_WEIGHTS:
        if not values:
            raise ConfigError("set-weights needs name=value pairs, e.g. answer_f1=0.5 citation=0.2")
        weights = {}
        for pair in values:
            if "=" not in pair:
                raise ConfigError(f"set-weights expects name=value, got {pair!r} (e.g. answer_f1=0.5)")
            k, v = pair.split("=", 1)
            try:
                weights[k.strip()] = float(v)
            except ValueError:
                raise ConfigError(f"weight for {k.strip()!r} must be a number, got {v!r}") from None
        return {"weights": weights}
    if kind == SET_DIFFICULTY or kind in live_settings.NUMBERS:
        if len(values) != 1:
            raise ConfigError(f"{action} takes one value, got {len(values)}")
        try:
            v = float(values[0])
        except ValueError:
            raise ConfigError(f"{action} value must be a number, got {values[0]!r}") from None
        setting = live_settings.BY_KIND[kind]
        integer = getattr(setting, "integer", False)  # a level stays a float: refused by name when not whole
        return {setting.key: int(v) if integer and v.is_integer() else v}  # 2.5 stays, to be refused by name
    if kind == SET_AUTOPILOT:
        if len(values) != 1 or values[0].lower() not in ON_OFF:
            raise ConfigError(f"{action} takes on or off, got {' '.join(values)!r}")
        return {"enabled": ON_OFF[values[0].lower()]}
    if values:
        raise ConfigError(f"{action} takes no values, got {' '.join(values)!r}")
    return {}


def cli_help() -> str:
    """The `control` command's values, one clause per setting (its help line)."""
    parts = ["set-weights: name=value ...", "set-difficulty: N", "set-autopilot: on|off"]
    parts += [f"{s.cli}: {s.key}" + (" (not below the current step)" if s.key == "steps" else "")
              for s in live_settings.NUMBER_SETTINGS]
    return "; ".join(parts)


def cli_actions() -> list[str]:
    return [k.replace("_", "-") for k in CONTROL_KINDS]


def validate_request(kind: str, payload: dict, metric_names: list[str] | None = None,
                     max_level: int = 4) -> dict:
    """Check a request; return its normalised payload or raise ConfigError naming the field.

    Any request may carry a "reason" (text, e.g. the autopilot's evidence for a move) and
    "undo_of" (the id of the request it reverts); both are kept in the payload."""
    if kind not in CONTROL_KINDS:
        raise ConfigError(f"unknown request kind {kind!r}; kinds are: {', '.join(CONTROL_KINDS)}")
    return {**_validate_setting(kind, payload, metric_names, max_level), **_annotations(payload)}


def _annotations(payload: dict) -> dict:
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


def _validate_setting(kind: str, payload: dict, metric_names, max_level: int) -> dict:
    if kind == SET_WEIGHTS:
        return {"weights": validate_weights(payload.get("weights"), metric_names)}
    if kind in live_settings.NUMBERS:
        setting = live_settings.NUMBERS[kind]
        return {setting.key: setting.check(payload.get(setting.key))}
    if kind == SET_DIFFICULTY:
        v = payload.get("level")
        if not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= max_level:
            raise ConfigError(f"level must be an integer from 1 to {max_level}, got {v!r}")
        return {"level": int(v)}
    if kind == SET_AUTOPILOT:
        v = payload.get("enabled")
        if not isinstance(v, bool):
            raise ConfigError(f"enabled must be true or false, got {v!r}")
        return {"enabled": v}
    return {}


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
    trainer takes every kind (set_difficulty only on a task with levels: the demo), a pilot only a
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
    task = run.cfg("task", "name", "demo")
    return tuple(k for k in CONTROL_KINDS if k != SET_DIFFICULTY or task == "demo")


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
