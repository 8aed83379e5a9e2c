"""Requests as the live page shows them: the changes to send, their status, the autopilot's moves.

The changes are what the sliders would send; each autopilot move carries its Undo."""
from __future__ import annotations

import pandas as pd

from grpo_core.analysis.autopilot import undo_request
from grpo_core.dashboard.live_view import RUN_SETTINGS, LiveState
from grpo_core.runs import live_settings
from grpo_core.runs.store import APPLIED, PENDING, REJECTED


def pending_changes(settings: dict, weights: dict, min_group_std: float, level: int,
                    run: dict | None = None) -> list[tuple[str, dict]]:
    """The requests that move the run from `settings` to the slider values: one per kind
    that differs (a weight change is one request carrying every weight). run: the page's
    group_size / prompts_per_step / temperature / steps inputs (any subset)."""
    out = []
    for key, value in (run or {}).items():
        if value is not None and key in RUN_SETTINGS and settings.get(key) is not None \
                and abs(float(value) - float(settings[key])) > 1e-9:
            out.append((RUN_SETTINGS[key].kind, {key: RUN_SETTINGS[key].cast(value)}))
    if any(abs(float(weights.get(m, 0.0)) - w) > 1e-9 for m, w in settings["weights"].items()):
        out.append(("set_weights", {"weights": {m: float(weights.get(m, 0.0)) for m in settings["weights"]}}))
    if abs(float(min_group_std) - settings["min_group_std"]) > 1e-12:
        out.append(("set_threshold", {"min_group_std": float(min_group_std)}))
    if int(level) != settings["level"]:
        out.append(("set_difficulty", {"level": int(level)}))
    return out


def describe_request(row) -> str:
    """'pending', 'applied at step N', 'rejected: <reason>' for a control row."""
    if row["status"] == APPLIED:
        step = row["applied_step"]
        return f"applied at step {int(step)}" if step == step and step is not None else "applied"
    if row["status"] == REJECTED:
        return f"rejected: {row['message'] or 'no reason given'}"
    return "pending (applied at the next step boundary)" if row["status"] == PENDING else "being applied"


def request_lines(state: LiveState, ids: list[int]) -> list[dict]:
    """Status of the requests this session sent, newest first."""
    if state.control.empty or not ids:
        return []
    rows = state.control[state.control["id"].isin(ids)].sort_values("id", ascending=False)
    return [{"id": int(r["id"]), "kind": r["kind"], "payload": r["payload"], "status": r["status"],
             "applied_step": None if r["applied_step"] != r["applied_step"] else r["applied_step"],
             "text": describe_request(r)} for _, r in rows.iterrows()]


def autopilot_moves(state: LiveState) -> list[dict]:
    """The autopilot's moves, newest first: step decided, what, why, the request's status,
    and the inverse request the page's Undo sends (None for a stop, or once undone)."""
    ctl = state.control.set_index("id") if not state.control.empty else pd.DataFrame()
    undone = {}
    if not state.control.empty:
        for rid, p in zip(state.control["id"], state.control["payload"]):
            if isinstance(p, dict) and p.get("undo_of") is not None:
                undone[int(p["undo_of"])] = int(rid)
    out = []
    for m in reversed(state.moves):
        rid = int(m.get("request_id", 0))
        row = ctl.loc[rid] if rid in ctl.index else None
        status = describe_request(row) if row is not None else "sent"
        undo = undo_request(m) if rid not in undone and row is not None and row["status"] == APPLIED else None
        out.append({"request_id": rid, "step": m.get("step"), "move": m.get("move"), "kind": m.get("kind"),
                    "summary": live_settings.describe(m.get("kind", ""), m.get("request") or {}),
                    "reason": m.get("reason", ""), "status": status, "undo": undo, "undone_by": undone.get(rid)})
    return out

