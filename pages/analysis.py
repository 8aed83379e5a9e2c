"""Analysis page: what a run (finished, running, failed or imported) teaches.

Thin: layout and widgets. Every number comes from grpo_core.analysis.report (pandas/numpy over
the run store, no torch); the time-series charts shared with the live page come from
grpo_core.analysis.charts. The run is the sidebar's pick (st.session_state["run_id"]), else the
newest run.
"""
from __future__ import annotations

import streamlit as st

from grpo_core.analysis import charts, comparison, formatting, inspector, prompt_history, report, run_data
from grpo_core.dashboard import frame
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs import presets
from grpo_core.runs.run_index import list_runs

picked = frame.open_page()
st.header("Analysis")


@st.cache_data(show_spinner="Reading the run…", max_entries=8)
def load_report(path: str, window: int, stamp: tuple) -> report.Report:
    """Cached per (run, window, store state): a live run's new steps change the stamp (report.store_stamp)."""
    return report.build_report(path, window=window)


@st.cache_data(show_spinner="Reading the prompts…", max_entries=8)
def load_prompts(path: str, stamp: tuple):
    return prompt_history.load(path)


# ---- which run ---------------------------------------------------------------------------------
runs = list_runs()
if runs.empty:
    st.info("No runs yet: start one on the Runs page, or from the terminal: `python -m grpo_core train`.")
    st.stop()
ids = runs["run_id"].tolist()
run_id = picked if picked in ids else ids[0]  # list_runs() is newest first
row = runs.set_index("run_id").loc[run_id]
st.caption(f"Run **{run_id}** · {row['status']} (choose another run in the sidebar)")
window = int(st.number_input("Window (steps)", 1, 10_000, run_data.DEFAULT_WINDOW, key="analysis_window",
                             help="Steps before/after each change in the ledger, and the rolling ratio"))
try:
    rep = load_report(row["path"], window, report.store_stamp(row["path"]))
except (StoreError, ConfigError, ValueError) as e:
    st.error(f"Cannot analyse run {run_id}: {e}")
    st.stop()

for n in rep.notices:
    {"info": st.info, "warning": st.warning, "error": st.error}[n.level](n.text)
if not len(rep.steps):
    st.stop()

tab_tr, tab_bn, tab_led, tab_prompts, tab_roll, tab_cmp, tab_exp = st.tabs(
    ["Trainability", "Bottlenecks", "Change ledger", "Prompts", "Rollouts", "Compare runs", "Export"])

# ---- trainability ---------------------------------------------------------------------------------
with tab_tr:
    s = rep.summary
    c = st.columns(4)
    c[0].metric("Groups trainable", formatting.fmt(s["trainable"]) + (f" / {formatting.fmt(s['submitted'])}" if s["submitted"] else ""))
    c[1].metric("Trainable ratio", formatting.fmt(s["ratio"]))
    c[2].metric("Steps with zero trainable", len(s["zero_trainable_steps"]))
    c[3].metric("Phantom groups", formatting.fmt(s["phantom"]))
    if s["zero_trainable_steps"]:
        st.caption("Zero trainable groups at steps: " + formatting.fmt(s["zero_trainable_steps"][:50])
                   + (" …" if len(s["zero_trainable_steps"]) > 50 else ""))
    st.plotly_chart(charts.trainability_chart(rep.steps, rep.ledger), key="an_ratio")
    st.markdown(f"**Why groups were flat**: {report.flat_text(rep)}")  # one cause per flat group (flat_causes)
    if rep.flat is not None:
        st.plotly_chart(charts.flat_causes_chart(rep.data.wide, rep.ledger), key="an_flat")
    st.markdown(f"**Reward trend**: whole run {rep.trend['run_text']}; last {rep.window} steps "
                f"{rep.trend['last_text']}.")
    st.plotly_chart(charts.reward_trend_chart(rep.steps, rep.trend, rep.ledger), key="an_reward")
    if len(rep.evaluation):
        st.plotly_chart(charts.eval_chart(rep.data.wide, rep.ledger), key="an_eval")
    if rep.verdict is not None:
        st.markdown(f"**Health verdict (last window): {rep.verdict.status}**")
        for chk in rep.verdict.checks:
            st.markdown(f"- {chk.text}")
        for a in rep.verdict.alerts:
            st.markdown(f"- ⚠ {a.message}")

# ---- bottlenecks ---------------------------------------------------------------------------------
with tab_bn:
    st.markdown(rep.bottleneck_text)
    if len(rep.bottlenecks):
        st.dataframe(rep.bottlenecks.drop(columns="why"), hide_index=True, key="an_bn_table")
        for why in rep.bottlenecks.loc[rep.bottlenecks["bottleneck"], "why"]:
            st.markdown(f"- {why}")
        if rep.bottlenecks["uniform_fraction"].notna().any():
            st.plotly_chart(charts.bottlenecks_chart(rep.bottlenecks), key="an_bn_fig")
    fig = charts.metric_std_chart(rep.data.wide, rep.data.metrics, rep.data.changes)
    if fig is not None:
        st.plotly_chart(fig, key="an_metric_std")

# ---- change ledger ------------------------------------------------------------------------------
with tab_led:
    st.caption(f"Each applied change, with the trainable ratio, reward and reward std over up to {rep.window} "
               "steps before it and from it on (a window stops at a neighbouring change and at the run's ends). "
               "reuse: the ratio rose and the reward did not fall.")
    if len(rep.ledger):
        st.dataframe(rep.ledger[report.LEDGER_SHOW], hide_index=True, key="an_ledger")
    else:
        st.info("No applied changes in this run.")
    reuse = rep.ledger[rep.ledger["reuse"].astype(bool) & (rep.ledger["kind"] == "set_weights")] \
        if len(rep.ledger) else rep.ledger
    if len(reuse):
        with st.expander("Save a weight change that helped (reuse) as a preset"):
            pick = st.selectbox("Change", list(reuse.index), key="an_preset_row",
                                format_func=lambda i: f"step {reuse.loc[i, 'step']}: {reuse.loc[i, 'change']} (ratio "
                                f"{formatting.fmt(reuse.loc[i, 'ratio_before'], 2)} → {formatting.fmt(reuse.loc[i, 'ratio_after'], 2)})")
            name = st.text_input("Preset name", key="an_preset_name", placeholder="e.g. cite-less")
            if st.button("Save preset", key="an_save_preset", disabled=not name.strip()):
                try:
                    path = presets.save_preset(name.strip(), **presets.from_ledger_row(reuse.loc[pick], run_id))
                    st.success(f"saved preset {name.strip()} ({path}): start a run from it on the Runs page")
                except ConfigError as e:
                    st.error(str(e))
    fig = charts.weights_chart(rep.data.wide, rep.data.metrics, rep.data.changes)
    if fig is not None:
        st.plotly_chart(fig, key="an_weights")

# ---- rollout inspector --------------------------------------------------------------------------
with tab_roll:
    idx = inspector.group_index(rep.data)
    if rep.data.rollouts.empty:
        st.info("No rollouts recorded in this run: the rollout inspector has nothing to show.")
    else:
        steps = sorted(int(x) for x in idx["step"].unique())
        c1, c2 = st.columns(2)
        step = c1.selectbox("Step", steps, index=len(steps) - 1, key="an_step")
        at_step = idx[idx["step"] == step]

        def label(g: int) -> str:
            r = at_step[at_step["group"] == g]
            if "trainable" not in r or not len(r):
                return f"group {g}"
            return f"group {g} · " + ("phantom" if r["phantom"].iloc[0] else
                                       "trainable" if r["trainable"].iloc[0] else "not trainable")
        group = c2.selectbox("Group", [int(g) for g in at_step["group"]], format_func=label, key="an_group")
        try:
            gv = inspector.inspect_group(rep.data, step, group)
        except (run_data.ReportError, StoreError) as e:
            st.error(str(e))
        else:
            if gv.prompt_id:
                st.caption(f"prompt {gv.prompt_id}")
            if gv.prompt:
                st.code(gv.prompt, language=None)
            (st.success if gv.trainable else st.warning)(gv.explanation)
            if len(gv.table):
                st.dataframe(gv.table, hide_index=True, key="an_group_table")

# ---- per prompt -----------------------------------------------------------------------------------
with tab_prompts:
    prompts = load_prompts(row["path"], report.store_stamp(row["path"]))
    if prompts.empty:
        st.info("This run recorded no prompt ids with its groups: no per-prompt history.")
    else:
        never = prompt_history.never_trainable(prompts)
        st.markdown(f"**{len(prompts)} prompts**; **{len(never)}** never gave a trainable group "
                    f"({len(never) / len(prompts):.0%}).")
        st.plotly_chart(charts.prompt_rates_chart(prompts), key="an_prompt_rates")
        st.dataframe(prompts, hide_index=True, key="an_prompts")
        st.download_button("Never-trainable prompts (JSONL)", prompt_history.to_jsonl(never),
                           f"{run_id}-never-trainable.jsonl", "application/json", key="an_never_jsonl",
                           disabled=never.empty)

# ---- run comparison -------------------------------------------------------------------------------
with tab_cmp:
    chosen = st.multiselect("Runs to compare", ids, default=[run_id], key="an_compare")
    if len(chosen) < 2:
        st.info("Choose at least two runs to compare.")
    else:
        paths = [runs.set_index("run_id").loc[r, "path"] for r in chosen]
        try:
            summary, diff = comparison.compare_runs(paths, window)
        except (StoreError, ConfigError, ValueError) as e:
            st.error(str(e))
        else:
            st.dataframe(summary, key="an_cmp_summary")
            st.markdown("**Config keys that differ**")
            if len(diff):
                st.dataframe(diff.astype(str), key="an_cmp_diff")
            else:
                st.caption("The configs are identical.")
            st.plotly_chart(comparison.ratio_figure(paths, window), key="an_cmp_fig")
            held_out = comparison.eval_figure(paths)
            if held_out is not None:
                st.plotly_chart(held_out, key="an_cmp_eval")

# ---- export ----------------------------------------------------------------------------------------
with tab_exp:
    st.caption("The HTML report is one self-contained file (charts included): it opens offline.")
    c = st.columns(3)
    c[0].download_button("HTML report", lambda: report.to_html(rep), f"{run_id}-report.html", "text/html",
                         key="an_dl_html")
    c[1].download_button("Markdown report", lambda: report.to_markdown(rep), f"{run_id}-report.md", "text/markdown",
                         key="an_dl_md")
    c[2].download_button("Per-step CSV", lambda: report.steps_csv(rep), f"{run_id}-steps.csv", "text/csv",
                         key="an_dl_csv")
