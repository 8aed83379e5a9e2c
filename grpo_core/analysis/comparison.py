"""Several runs side by side: their trainability, rewards and evaluations, and the config keys that differ."""
from __future__ import annotations

import pandas as pd

from grpo_core.analysis import charts
from grpo_core.analysis.run_data import DEFAULT_WINDOW, ReportError, RunData, load_run
from grpo_core.analysis.run_tables import EVAL_COLS, eval_table, reward_trend, steps_table, trainability
from grpo_core.analysis.windows import column
from grpo_core.runs import names
from grpo_core.runs.run_meta import FAILED, FINISHED, STOPPED


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _wall_time(data: RunData) -> float | None:
    end = data.meta.get("status_time") if data.status in (FINISHED, FAILED, STOPPED) else None
    end = end or data.meta.get("heartbeat")
    start = data.meta.get("started") or data.meta.get("created")
    if data.imported or not end or not start:
        return None  # an import's timestamps are the import's, not the run's
    return float(end) - float(start)


def compare_runs(runs: list, window: int = DEFAULT_WINDOW) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs side by side: (summary, config_diff). config_diff has one row per config key
    whose value differs between the runs (missing keys count as different)."""
    if len(runs) < 2:
        raise ReportError(f"a comparison needs at least two runs, got {len(runs)}")
    datas = [load_run(r) for r in runs]
    rows = []
    for d in datas:
        st = steps_table(d, window)
        tr, rt, ev = trainability(st, window), reward_trend(st, window), eval_table(d)
        step_s = column(d.wide, names.TIME_STEP)
        rows.append({"run": d.run_id, "status": d.status, "steps": tr["steps"],
                     "last_step": tr["last_step"], "planned_steps": d.cfg("grpo", "steps"),
                     "submitted": tr["submitted"], "trainable": tr["trainable"], "ratio": tr["ratio"],
                     "reward_final": rt.get("final"), "reward_best": rt.get("best"),
                     "reward_trend": rt["run_text"],
                     **{f"eval_{col}_final": (float(ev[col].dropna().iloc[-1]) if col in ev and ev[col].notna().any()
                                              else None) for col in EVAL_COLS.values()},
                     "train_time_s": float(step_s.sum()) if step_s is not None else None,
                     "wall_time_s": _wall_time(d)})
    summary = pd.DataFrame(rows).set_index("run")
    flat = [_flatten(d.config) for d in datas]
    keys = sorted(set().union(*flat))
    missing = object()
    diff = {k: [f.get(k, missing) for f in flat] for k in keys}
    diff = {k: v for k, v in diff.items() if any(x != v[0] or x is missing for x in v)}
    labels = _unique_labels([d.run_id for d in datas])
    config_diff = pd.DataFrame({lab: [("—" if v[i] is missing else v[i]) for v in diff.values()]
                                for i, lab in enumerate(labels)}, index=pd.Index(list(diff), name="key"))
    return summary, config_diff


def _unique_labels(ids: list[str]) -> list[str]:
    seen: dict = {}
    out = []
    for i in ids:
        seen[i] = seen.get(i, 0) + 1
        out.append(i if seen[i] == 1 else f"{i} ({seen[i]})")
    return out


def ratio_figure(runs: list, window: int = DEFAULT_WINDOW):
    """The runs' trainable ratios pooled over `window` steps, on one chart."""
    datas = [load_run(r) for r in runs]
    labels = _unique_labels([d.run_id for d in datas])
    return charts.compare_ratio_chart({label: steps_table(d, window)["ratio_rolling"]
                                       for label, d in zip(labels, datas)}, window)


def eval_figure(runs: list):
    """The runs' held-out reward and pass@1 on one chart; None when no run evaluated."""
    datas = [load_run(r) for r in runs]
    labels = _unique_labels([d.run_id for d in datas])
    return charts.compare_eval_chart({label: eval_table(d) for label, d in zip(labels, datas)})
