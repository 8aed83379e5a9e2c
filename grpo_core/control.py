"""Control requests: parsed and checked on the sending side (CLI, dashboard), checked
again and applied by the trainer between steps. The store makes them exactly-once."""
from __future__ import annotations

import math

from grpo_core.config import ConfigError, validate_weights
from grpo_core.store import (CONTROL_KINDS, SET_DIFFICULTY, SET_THRESHOLD, SET_WEIGHTS, RunStore)


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
    if kind in (SET_THRESHOLD, SET_DIFFICULTY):
        if len(values) != 1:
            raise ConfigError(f"{action} takes one value, got {len(values)}")
        try:
            v = float(values[0])
        except ValueError:
            raise ConfigError(f"{action} value must be a number, got {values[0]!r}") from None
        return {"min_group_std": v} if kind == SET_THRESHOLD else {"level": v}
    if values:
        raise ConfigError(f"{action} takes no values, got {' '.join(values)!r}")
    return {}


def validate_request(kind: str, payload: dict, metric_names: list[str] | None = None,
                     max_level: int = 4) -> dict:
    """Check a request; return its normalised payload or raise ConfigError naming the field."""
    if kind not in CONTROL_KINDS:
        raise ConfigError(f"unknown request kind {kind!r}; kinds are: {', '.join(CONTROL_KINDS)}")
    if kind == SET_WEIGHTS:
        return {"weights": validate_weights(payload.get("weights"), metric_names)}
    if kind == SET_THRESHOLD:
        v = payload.get("min_group_std")
        if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1:
            raise ConfigError(f"min_group_std must be a number in [0, 1), got {v!r}")
        return {"min_group_std": float(v)}
    if kind == SET_DIFFICULTY:
        v = payload.get("level")
        if not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= max_level:
            raise ConfigError(f"level must be an integer from 1 to {max_level}, got {v!r}")
        return {"level": int(v)}
    return {}


def send(run, kind: str, payload: dict, source: str = "ui") -> int:
    """Validate against the run's metrics and write a pending request; returns its id."""
    with RunStore.open(run) as store:
        metrics = list(((store.config.get("reward") or {}).get("weights") or {}).keys()) or None
        clean = validate_request(kind, payload, metrics)
        return store.request(kind, clean, source=source)
