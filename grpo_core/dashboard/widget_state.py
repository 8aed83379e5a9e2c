"""The live page's widget state: plain functions over a dict-like session state.

Streamlit keeps a widget's value in st.session_state under the widget's key; the live page
seeds those keys from the settings in force and keeps them in step with the run. Every
rule of that bookkeeping lives here, over any MutableMapping (st.session_state in the
page, a plain dict in tests/test_steering.py), so the page only draws the widgets:

- `sync` seeds the weight sliders, the threshold and level sliders and the run-setting
  inputs (live_view.RUN_SETTINGS, from the settings registry) from the settings in force, and
  makes an input the user has not touched follow a change made elsewhere (an autopilot
  move, another tab, the CLI), while an edited one keeps the user's value.
- The weight sliders' range is fixed per run (a changed range makes Streamlit treat the
  sliders as new widgets, back to 0); it only grows, when a weight set elsewhere exceeds
  it, and then the sliders are re-seeded.
- The specs (`run_input_spec`, `threshold_spec`, ...) are the widgets' keyword arguments,
  their bounds, steps and help taken from grpo_core.runs.live_settings.

No Streamlit import: nothing here needs a browser or a script run.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

from grpo_core.dashboard.live_view import RUN_SETTINGS
from grpo_core.runs import live_settings
from grpo_core.runs.store import APPLYING, PENDING

WEIGHT_STEP = 0.01  # the weight sliders' resolution ...
WEIGHT_DIGITS = 2  # ... as the digits a weight is rounded to in a slider
THRESHOLD_MAX = 0.3  # the threshold slider's top (the setting itself may go up to 1, open)
LEVELS = (1, 4)  # the difficulty slider: task.level, 1 easy .. 4 hard (config.validate)
OPEN_BOUND_STEP = 0.01  # an open lower bound (temperature > 0): the smallest value an input offers
THRESHOLD = live_settings.BY_KEY["min_group_std"]
DIFFICULTY = live_settings.BY_KIND[live_settings.SET_DIFFICULTY]
OPEN = (PENDING, APPLYING)  # a request not resolved yet
# Set once a session has painted the live page: its first paint is the run line, the progress and
# the charts, and the cards, alerts and controls come with the whole-page rerun the browser asks
# for once it painted those (a browser short of CPU shows the charts well before the whole page's
# ~110 elements; docs/benchmarks.md "Live page: viewers").
PAINTED = "live_page_painted"


@dataclass(frozen=True)
class Keys:
    """The session-state keys of one run's steering widgets (a key per run: switching runs
    never carries one run's slider values to another)."""
    run_id: str
    weights: dict  # metric -> its slider's key
    run: dict  # run-setting key (live_view.RUN_SETTINGS) -> its input's key

    @property
    def thr(self) -> str:
        return f"thr:{self.run_id}"

    @property
    def lvl(self) -> str:
        return f"lvl:{self.run_id}"

    @property
    def top(self) -> str:  # the weight sliders' range
        return f"wtop:{self.run_id}"

    @property
    def seen(self) -> str:  # the settings in force at the last sync
        return f"seen:{self.run_id}"

    @property
    def suggestions(self) -> str:
        return f"sugg:{self.run_id}"

    @property
    def autopilot(self) -> str:
        return f"ap:{self.run_id}"

    @property
    def autopilot_seen(self) -> str:
        return f"ap_seen:{self.run_id}"

    @property
    def preset_name(self) -> str:
        return f"preset_name:{self.run_id}"


def keys(run_id: str, metrics=()) -> Keys:
    return Keys(run_id, {m: f"w:{run_id}:{m}" for m in metrics}, {k: f"{k}:{run_id}" for k in RUN_SETTINGS})


def as_weight(value) -> float:
    """A weight as a slider holds it (its resolution)."""
    return round(float(value), WEIGHT_DIGITS)


def load_values(ss: MutableMapping, k: Keys, weights: dict, thr: float | None = None, lvl: int | None = None):
    """Put these weights (metrics without a slider are ignored), threshold and level into the
    sliders: the first seeding, the Reset button, a suggestion's Load button."""
    for m, w in weights.items():
        if m in k.weights:
            ss[k.weights[m]] = as_weight(w)
    if thr is not None:
        ss[k.thr] = float(thr)
    if lvl is not None:
        ss[k.lvl] = int(lvl)


def load_run_values(ss: MutableMapping, k: Keys, settings: dict, only_missing: bool = False):
    """Put the run settings (G, prompts per step, ...) into their inputs, each as its type
    (only_missing: leave the inputs already there, which the user may have edited)."""
    for key, ss_key in k.run.items():
        if only_missing and ss_key in ss:
            continue
        if settings.get(key) is not None:
            ss[ss_key] = RUN_SETTINGS[key].cast(settings[key])


def slider_top(weights: dict) -> float:
    """The weight sliders' range for these weights: at least 1, with room above the largest."""
    need = max(weights.values(), default=1.0)
    return float(max(1.0, round(need * 1.5 + 0.005, 2)))


def sync(ss: MutableMapping, run_id: str, cur: dict) -> Keys:
    """Bring one run's steering widgets in step with `cur` (live_view.current_settings) before
    they are drawn: seed what is missing, grow the weight range when a weight exceeds it,
    and let every input the user has not touched follow a change made elsewhere."""
    k = keys(run_id, cur["weights"])
    if ss.get(k.top, 0) < max(cur["weights"].values(), default=1.0):
        ss[k.top] = slider_top(cur["weights"])
        load_values(ss, k, cur["weights"], cur["min_group_std"], cur["level"])
    if any(key not in ss for key in k.weights.values()) or k.thr not in ss:
        load_values(ss, k, cur["weights"], cur["min_group_std"], cur["level"])
    load_run_values(ss, k, cur, only_missing=True)
    prev = ss.get(k.seen)
    if prev is not None:
        follow_changes(ss, k, prev, cur)
    ss[k.seen] = {key: (dict(v) if isinstance(v, dict) else v) for key, v in cur.items()}
    return k


def follow_changes(ss: MutableMapping, k: Keys, prev: dict, cur: dict):
    """Settings changed from `prev` to `cur` elsewhere: an input still showing the old value
    (the user has not touched it) takes the new one, else it would offer to revert the
    change; an input the user edited keeps the user's value."""
    inputs = {**{k.weights[m]: (prev["weights"].get(m), cur["weights"].get(m), as_weight) for m in k.weights},
              k.thr: (prev["min_group_std"], cur["min_group_std"], float),
              k.lvl: (prev["level"], cur["level"], int),
              **{k.run[key]: (prev.get(key), cur.get(key), RUN_SETTINGS[key].cast) for key in k.run}}
    for ss_key, (old, new, cast) in inputs.items():
        if old is not None and new is not None and old != new and ss.get(ss_key) == cast(old):
            ss[ss_key] = cast(new)


def shown_values(ss: MutableMapping, k: Keys, accepts, cur: dict) -> tuple[dict, float, int, dict]:
    """What the steering controls show: the weights, the threshold, the level and the run-setting
    inputs the run accepts (a control not drawn, as the setting in force `cur`). Read from the
    session state, which a button's callback sees as the browser sent it, before any redraw."""
    weights = {m: float(ss.get(key, cur["weights"].get(m, 0.0))) for m, key in k.weights.items()}
    lvl = ss.get(k.lvl, cur["level"]) if live_settings.SET_DIFFICULTY in accepts else cur["level"]
    run = {key: ss.get(k.run[key]) for key in run_inputs(accepts)}
    return weights, float(ss.get(k.thr, cur["min_group_std"])), int(lvl), run


def sync_autopilot(ss: MutableMapping, k: Keys, enabled: bool) -> str:
    """The autopilot switch shows the switch in force whenever that changes (applied, or
    changed elsewhere); between changes it keeps what the user set. Returns its key."""
    if ss.get(k.autopilot_seen) != enabled:
        ss[k.autopilot] = ss[k.autopilot_seen] = enabled
    return k.autopilot


# ---- this session's requests ---------------------------------------------------------------------
def my_requests(ss: MutableMapping, run_id: str) -> list[int]:
    """The ids of the requests this session sent to the run (its 'Your requests' box)."""
    return ss.setdefault("my_requests", {}).setdefault(run_id, [])


def open_requests(lines: list[dict]) -> list[dict]:
    """The request lines (request_view.request_lines) not resolved yet."""
    return [r for r in lines if r["status"] in OPEN]


def request_resolved(ss: MutableMapping, lines: list[dict]) -> bool:
    """Whether one of this session's open requests was resolved since the last call (the
    page then redraws the sliders too); remembers the open ones."""
    open_now = {r["id"] for r in open_requests(lines)}
    resolved = bool(ss.get("open_requests", set()) - open_now)
    ss["open_requests"] = open_now
    return resolved


# ---- the widgets' arguments ------------------------------------------------------------------------
def run_input_spec(setting: live_settings.NumberSetting) -> dict:
    """A run-setting number input's keyword arguments: label, bounds, step, format and help
    from the settings registry, the bounds of its type (int or float)."""
    number = int if setting.integer else float
    lo = setting.lo + (OPEN_BOUND_STEP if setting.lo_open else 0)
    why = setting.what + ("; not below the step the run has reached" if setting.key == "steps" else
                          "; from the next step")
    extra = {k: v for k, v in (("step", setting.step), ("format", setting.fmt)) if v is not None}
    return {"label": setting.label, "min_value": number(lo), "max_value": number(setting.hi), "help": why, **extra}


def run_inputs(accepts) -> list[str]:
    """The run-setting inputs the page shows (their keys, in order): those the run accepts."""
    return [key for key, setting in RUN_SETTINGS.items() if setting.kind in accepts]


def weight_spec(metric: str, top: float) -> dict:
    return {"label": metric, "min_value": 0.0, "max_value": float(top), "step": WEIGHT_STEP}


def threshold_spec() -> dict:
    return {"label": THRESHOLD.label, "min_value": float(THRESHOLD.lo), "max_value": THRESHOLD_MAX,
            "step": THRESHOLD.step, "format": THRESHOLD.fmt, "help": THRESHOLD.what}


def level_spec() -> dict:
    return {"label": DIFFICULTY.label, "min_value": LEVELS[0], "max_value": LEVELS[1],
            "help": f"demo task level ({LEVELS[0]} easy .. {LEVELS[1]} hard); not predictable from past rollouts"}
