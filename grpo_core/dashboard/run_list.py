"""The Runs page's rows (progress, ETA, config summary) and the run a page opens by default.

The default run is the newest live training run, else the newest training run."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from grpo_core.dashboard.live_cards import fmt_eta, progress
from grpo_core.dashboard.live_view import LiveState
from grpo_core.errors import StoreError
from grpo_core.runs.names import TIME_STEP
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import LIVE_STATUSES, RunMeta
from grpo_core.runs.store import RunStore


def config_summary(meta: dict, now: dict | None = None) -> str:
    """One line of the run's set-up; `now` (live_view.current_settings) gives the settings in force,
    so a level or G the autopilot changed mid-run is shown as it is, not as the run started."""
    run = RunMeta.parse(meta)
    if run.source != "grpo_core":
        return f"imported from {run.source}"
    c, now = run.config, {**run.settings, **(now or {})}  # meta's settings: what the trainer applied
    t, m, g = c.get("task") or {}, c.get("model") or {}, c.get("grpo") or {}
    level, group = now.get("level") or t.get("level", 1), now.get("group_size") or g.get("group_size", "?")
    prompts = now.get("prompts_per_step") or g.get("prompts_per_step", "?")
    threshold = now.get("min_group_std", g.get("min_group_std", 0))
    task = f"jsonl {Path(str(t.get('dataset', ''))).name}" if t.get("name") == "jsonl" \
        else f"{t.get('name', 'demo')} L{level}"
    model = Path(m["path"]).name if m.get("path") else "built-in model"
    return (f"{task} · {model} · {prompts} prompts × G={group} · "
            f"lr {g.get('lr', 0):g} · min std {threshold:g}")


def runs_overview(root=None) -> pd.DataFrame:
    """list_runs plus what the runs page shows per run: progress, ETA, started, summary."""
    runs = list_runs(root)
    extra = []
    for _, r in runs.iterrows():
        row = {"progress": 0.0, "eta": "–", "started": "–", "summary": "", "done": None}
        if r["status"] != "unreadable":
            try:
                with RunStore.open(r["path"], readonly=True) as s:
                    meta = s.get_meta()
                    last = s.last_step()
                    dt = s.scalars_wide(since_step=(last - 20) if last is not None else -1,
                                        names=[TIME_STEP]) if last is not None else pd.DataFrame()
                state = LiveState(run_id=r["run_id"], db=str(s.path), meta=meta, last_step=-1 if last is None else last,
                               recent=dt)
                done, frac, eta = progress(state)
                row.update(progress=frac, eta=fmt_eta(eta) if eta is not None else "–", done=done,
                           summary=config_summary(meta))
                started = meta.get("started") or meta.get("launched") or meta.get("created")
                if started:
                    row["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
            except (StoreError, OSError, ValueError) as e:
                row["summary"] = f"unreadable: {e}"
        extra.append(row)
    return pd.concat([runs, pd.DataFrame(extra, index=runs.index)], axis=1) if len(runs) else \
        runs.assign(progress=[], eta=[], started=[], summary=[], done=[])


def default_run(root=None, runs: pd.DataFrame | None = None) -> str | None:
    """The run a fresh page shows: the newest live training run, else the newest training
    run, else (pilots only) the newest run. Runs come newest first from list_runs."""
    runs = list_runs(root) if runs is None else runs
    if runs.empty:
        return None
    train = runs[runs["kind"].fillna("train") == "train"]
    for pick in (train[train["status"].isin(LIVE_STATUSES)], train, runs):
        if len(pick):
            return str(pick.iloc[0]["run_id"])


def resolve_run(picked: str | None, from_url: str | None = None, root=None) -> str | None:
    """The run a page shows: the sidebar's pick, else ?run=<id> if it exists, else the default."""
    if picked:
        return picked
    runs = list_runs(root)
    if from_url and from_url in set(runs["run_id"]):
        return from_url
    return default_run(runs=runs)

