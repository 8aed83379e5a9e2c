"""Pilot page: sample and score before training, see whether the rewards vary inside
groups, plan the group size, and carry the chosen settings into a training run.

Thin: layout and widgets. Everything computed here comes from grpo_core.analysis.pilot (no torch),
the figures from grpo_core.analysis.charts (pilot_histograms, pilot_metric_std, pilot_planner)."""
from __future__ import annotations

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from grpo_core.analysis import charts, pilot
from grpo_core.dashboard import frame, pilot_start, processes, refresh
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs.config import DEMO_WEIGHTS
from grpo_core.runs.live_settings import BY_KEY
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import LIVE_STATUSES

GROUP_SIZE = BY_KEY["group_size"]
PROMPTS = BY_KEY["prompts_per_step"]
TEMPERATURE = BY_KEY["temperature"]  # the bounds a live request has (live_settings)

picked = frame.open_page()
st.header("Pilot: check reward variance before training")
st.caption("A pilot samples G completions for a few prompts with the current model and scores them, "
           "with no update. GRPO learns only from groups whose rewards differ: the pilot's trainable "
           "ratio is what the first training steps will see.")

runs = list_runs()
pilots = runs[runs["kind"] == "pilot"] if len(runs) else runs

# ---- start a pilot ----------------------------------------------------------------------------------
with st.expander("Start a pilot", expanded=pilots.empty):
    with st.form("pilot_form"):
        c1, c2, c3 = st.columns(3)
        level = c1.number_input("Demo level", 1, 4, 1, help="task.level: 1 easy .. 4 hard")
        group_size = c2.number_input("Group size G", 2, GROUP_SIZE.hi, 8, help="grpo.group_size: completions per prompt")
        prompts = c3.number_input("Prompts per batch", 1, PROMPTS.hi, 8, help="grpo.prompts_per_step")
        c1, c2, c3 = st.columns(3)
        batches = c1.number_input("Batches", 1, 200, pilot.DEFAULT_BATCHES, help="pilot batches (grpo.steps)")
        temperature = c2.number_input("Temperature", 0.05, TEMPERATURE.hi, 1.0, step=0.1, help="grpo.temperature")
        model_path = c3.text_input("Model path", "", help="local HF model folder; empty = built-in tiny model")
        st.caption("Reward weights")
        cols = st.columns(len(DEMO_WEIGHTS))
        weights = {m: col.number_input(m, 0.0, 10.0, float(w), step=0.05, key=f"pilot_w_{m}")
                   for col, (m, w) in zip(cols, DEMO_WEIGHTS.items())}
        start = st.form_submit_button("Start pilot", type="primary")
    if start:
        try:
            cfg = pilot_start.pilot_config(level, model_path, group_size, prompts, batches, temperature, weights)
            new = pilot_start.start_pilot(cfg, untrusted=True)
            st.session_state["pilot_pick"] = new  # show the new pilot
            st.success(f"pilot {new} started")
            runs = list_runs()
            pilots = runs[runs["kind"] == "pilot"]
        except (ConfigError, StoreError) as e:
            st.error(str(e))

# ---- pick a pilot ---------------------------------------------------------------------------------------
if pilots.empty:
    st.info("No pilot yet: start one above (a few seconds on the built-in model), or from the terminal: "
            "`python -m grpo_core pilot`.")
    st.stop()
ids = pilots["run_id"].tolist()
if st.session_state.get("pilot_pick") not in ids:  # first visit: the sidebar's run if it is a pilot
    st.session_state["pilot_pick"] = picked if picked in ids else ids[0]
run_id = st.selectbox("Pilot", ids, key="pilot_pick")
live = pilots.set_index("run_id").at[run_id, "status"] in LIVE_STATUSES


def show(run_id: str, target: float, polling: bool = False):
    try:
        s = pilot.pilot_summary(run_id, target=target)
    except (StoreError, ValueError) as e:
        st.error(str(e))
        return
    done, total = s.batches_done, s.batches or s.batches_done or 1
    st.progress(min(done / total, 1.0), text=f"{s.status}: {done} of {total} batches, {s.submitted} groups")
    if s.status in LIVE_STATUSES and st.button("Stop pilot", key="pilot_stop", help="stops after the current batch"):
        try:
            processes.stop_run(run_id)
            st.toast(f"stop sent to {run_id}")
        except (ConfigError, StoreError) as e:
            st.error(str(e))
    if polling and s.status not in LIVE_STATUSES:
        st.rerun()  # finished: redraw the whole page once, which stops the polling
    if s.status in ("failed", "stale", "stopped"):
        st.error(f"pilot {s.status}: {s.error or 'see trainer.log in its run folder'}")
    if s.ratio is None:
        st.info("No batch scored yet: the first one appears here when it is done.")
        return
    verdict(s)
    st.subheader("Reward distribution per metric")
    st.plotly_chart(charts.pilot_histograms(s.values, s.metrics), width="stretch")
    st.subheader("Within-group std per metric")
    st.plotly_chart(charts.pilot_metric_std(s.metric_table), width="stretch")
    st.dataframe(s.metric_table, width="stretch")
    planner(s)
    start_training(s, weight_options(s))


def verdict(s: pilot.PilotSummary):
    """The verdict, its actions and reasons, and the pilot's numbers."""
    v = s.verdict
    (st.success if v.ready else st.warning)(f"**{v.headline}**")
    for a in v.actions:
        st.markdown(f"- **{pilot.KIND_LABEL[a.kind]}**: {a.text}")
    with st.expander("Why", expanded=not v.ready):
        for r in v.reasons:
            st.markdown(f"- {r}")

    c = st.columns(4)
    c[0].metric("Predicted trainable ratio", f"{s.ratio:.2f}", help="the pilot's measured ratio: "
                "trainable groups / groups; what the first training steps will see")
    c[1].metric("Groups", f"{s.trainable} / {s.submitted}", help="trainable / submitted")
    c[2].metric("Mean group reward std", f"{s.reward_std:.3f}")
    c[3].metric("Phantom groups", s.phantom_groups, help="pass the std gate, outcome metric uniform")
    if s.uniform_metrics:
        st.warning("Uniform inside groups (variance bottleneck): " + ", ".join(f"`{m}`" for m in s.uniform_metrics))


def planner(s: pilot.PilotSummary):
    st.subheader("Group-size planner (binary metrics)")
    if not s.plans:
        st.caption("No binary metric in this pilot.")
    else:
        names = [p.metric for p in s.plans]
        focus = pilot.planner_focus(s)
        pick_m = st.selectbox("Binary metric", names, index=names.index(focus) if focus in names else 0,
                              key=f"pilot_plan_metric_{s.run_id}")
        plan = s.plans[names.index(pick_m)]
        g = f"G = {plan.g_needed}" if plan.g_needed else "no G up to 256"
        st.caption(f"{plan.metric} succeeds {plan.p:.0%} of the time: P(trainable) = 1 − p^G − (1−p)^G is "
                   f"{plan.current_p_trainable:.2f} at G = {plan.current_g}; target {s.target:.2f} needs {g}.")
        flat = pilot.flat_shares(plan)
        c = st.columns(3)
        c[0].metric(f"Flat groups, measured (G = {plan.current_g})", f"{flat['measured']:.0%}",
                    help=f"share of the pilot's groups in which {plan.metric} was all 0 or all 1")
        c[1].metric("Predicted, one pooled rate", f"{flat['pooled']:.0%}", help="p^G + (1−p)^G: as if every "
                    "prompt were equally hard; prompts that differ leave more groups flat than this")
        if flat["per_prompt"] is not None:
            c[2].metric("Predicted, per prompt", f"{flat['per_prompt']:.0%}", help=f"each of the {plan.prompts} "
                        "prompts at its own rate, shrunk toward the pooled one (Beta prior fitted to the pilot)")
            gp = f"G = {plan.prompts_g_needed}" if plan.prompts_g_needed else f"no G up to {pilot.PLANNER_G_MAX}"
            st.caption(f"Counting each prompt's own rate, the target needs {gp}: the group-size advice follows this.")
        st.plotly_chart(charts.pilot_planner(plan, s.target), width="stretch")


def weight_options(s: pilot.PilotSummary) -> dict:
    """The weight suggestions; returns the weights to start training with, by their label."""
    st.subheader("Weight suggestions")
    options = {"pilot's weights": s.weights}
    if s.suggestions:
        st.dataframe(pd.DataFrame([{**sg["weights"], "predicted ratio": sg["predicted_ratio"], "why": sg["why"]}
                                   for sg in s.suggestions]), width="stretch")
        options.update({f"suggestion {i + 1} (ratio {sg['predicted_ratio']:.2f})": sg["weights"]
                        for i, sg in enumerate(s.suggestions)})
    else:
        st.caption("No weights near these do better on this pilot.")
    return options


def start_training(s: pilot.PilotSummary, options: dict):
    """The pilot's settings with the verdict's first change, carried into the Runs page's form."""
    v = s.verdict
    st.subheader("Start training with these settings")
    st.caption("Prefilled with the pilot's settings and the first change the verdict names: change one "
               "thing at a time, then pilot again or watch the first training steps.")
    by_kind = {a.kind: a.settings for a in v.actions[:1]}
    c = st.columns(3)
    suggested = "weights" in by_kind.get("weights", {}) and len(options) > 1  # the verdict's weights: suggestion 1
    pick = c[0].radio("Weights", list(options), index=1 if suggested else 0, key="pilot_weights_choice")
    g_new = c[1].number_input("Group size G", 2, GROUP_SIZE.hi, int(by_kind.get("group_size", {}).get("group_size",
                              s.group_size)), key="pilot_train_g")
    lvl = c[2].number_input("Demo level", 1, 4, int(by_kind.get("difficulty", {}).get(
        "level", (s.config.get("task") or {}).get("level", 1))), key="pilot_train_level")
    if st.button("Start training with these settings", type="primary", key="pilot_start_training"):
        st.session_state["start_form_defaults"] = pilot.training_defaults(
            s, weights=options[pick], group_size=g_new, level=lvl,
            temperature=by_kind.get("temperature", {}).get("temperature"))
        try:
            st.switch_page("pages/runs.py")
        except StreamlitAPIException:  # the page runs on its own (no navigation): say where to go
            st.info("Settings saved: open the Runs page to start training with them.")


target = st.slider("Target trainable ratio", 0.05, 0.95, 0.3, 0.05, key="pilot_target",
                   help="the ratio the planner and the verdict aim for (health.min_trainable_ratio by default)")


@st.fragment
def polled(run_id: str, target: float):
    """The pilot while it runs: the store read again 2 s after the page drew the last read."""
    with refresh.steady("pilot"):
        with refresh.guarded("the pilot's results"):
            show(run_id, target, polling=True)
        refresh.after(2.0, key="pilot_refresh")


if live:
    polled(run_id, target)
else:
    show(run_id, target)
