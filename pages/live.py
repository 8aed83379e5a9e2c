"""Live monitor: health cards, charts, alerts and the weight sliders of one run.

Layout and widgets only: grpo_core.live reads the store incrementally and computes,
grpo_core.charts draws. The charts refresh every 2 s while the run is live (a fragment,
so the sliders below are not disturbed); a finished run is drawn once.
"""
import streamlit as st

from grpo_core import charts, control, live, presets, runner
from grpo_core.config import ConfigError
from grpo_core.store import StoreError, runs_dir
from grpo_core.safety import require_token
from app import through_app

if through_app():  # Streamlit's legacy pages/ routing ran this file on its own: app.py has run it
    st.stop()
require_token()  # here too: what opens this file directly (AppTest) meets the gate

ss = st.session_state
run_id = live.resolve_run(ss.get("run_id"), st.query_params.get("run"))
st.header("Live monitor")

if not run_id:
    st.info("No run yet. Start the built-in demo: a tiny model learning a cite-your-source task with "
            "five reward metrics, on this machine's CPU (a GPU when there is one).")
    if st.button("Start the demo run", type="primary", key="start_demo"):
        try:
            ss["goto_run"], _ = runner.start_demo_if_idle()
            st.rerun()
        except (ConfigError, StoreError) as e:
            st.error(str(e))
    st.stop()

RUN_DIR = runs_dir() / run_id


def state() -> live.LiveState:
    """This session's view of the run, brought up to date (reads only what changed)."""
    ss["live_state"] = live.load(RUN_DIR, ss.get("live_state"))
    return ss["live_state"]


def my_requests() -> list[int]:
    return ss.setdefault("my_requests", {}).setdefault(run_id, [])


def send(kind: str, payload: dict) -> bool:
    try:
        my_requests().append(control.send(RUN_DIR, kind, payload, source="ui"))
        return True
    except (ConfigError, StoreError) as e:
        st.error(str(e))
        return False


try:
    first = state()
except StoreError as e:
    st.error(str(e))
    st.stop()

REFRESH = live.REFRESH_S if first.is_live else (5.0 if first.status == "stale" else None)


@st.fragment(run_every=REFRESH)
def monitor():
    try:
        s = state()
    except StoreError as e:  # the run was deleted or damaged while we watched
        st.error(str(e))
        return
    if s.is_live != first.is_live:  # the run ended (or came back): redraw all, refresh on/off
        st.rerun()
    c = live.cards(s)
    caps = live.capabilities(s)

    top = st.columns([3, 2])
    badge = {"running": ":green", "paused": ":orange", "created": ":blue", "finished": ":gray",
             "stopped": ":gray", "failed": ":red", "stale": ":red"}.get(c.status, ":gray")
    top[0].markdown(f"**{run_id}** · {badge}[{c.status}] · {live.config_summary(s.meta)}")
    if c.steps:
        top[1].progress(c.progress, text=f"step {c.step or 0} of {c.steps} · ETA {live.fmt_eta(c.eta_s)}")
    if c.status == "failed":
        st.error(f"The run failed: {(s.meta.get('error') or 'no error recorded').strip().splitlines()[-1]}")
    elif c.status == "stale":
        st.warning("No heartbeat from the trainer: it may have crashed or been killed. See the Runs page.")
    elif c.status == "created":
        st.info("The trainer is starting (loading the model; the built-in one warms up once, ~30 s).")
    if caps["message"]:
        st.info(caps["message"])

    pct = lambda v: "–" if v is None else f"{v:.0%}"  # noqa: E731
    k = st.columns(5)
    k[0].metric("Trainable ratio (step)", pct(c.ratio), help="trainable / submitted groups at the last step")
    k[1].metric("Trainable ratio (cumulative)", pct(c.cum_ratio), help="over the whole run so far")
    k[2].metric("Mean group reward std", "–" if c.reward_std is None else f"{c.reward_std:.3f}",
                help="mean within-group std of the total reward over the health window")
    k[3].metric("Reward trend", live.TREND_ARROWS[c.trend] + ("" if c.reward is None else f" {c.reward:.3f}"),
                help=c.trend_text or "needs a few steps")
    k[4].metric("Groups trainable / submitted", "–" if c.submitted is None else f"{c.trainable} / {c.submitted}")

    verdict = {"healthy": st.success, "warning": st.warning, "critical": st.error}.get(c.verdict, st.info)
    verdict(f"**{c.verdict.upper()}** · " + " · ".join(ch.text for ch in c.checks if ch.text)
            if c.checks else "Not enough steps yet to judge.")
    for a in c.alerts:
        (st.error if a.severity == "critical" else st.warning)(f"{a.message} (step {a.step})")

    reqs = live.request_lines(s, my_requests())
    open_now = {r["id"] for r in reqs if r["status"] in ("pending", "applying")}
    if ss.get("open_requests", set()) - open_now:  # one of ours was just resolved: redraw the sliders too
        ss["open_requests"] = open_now
        st.rerun()
    ss["open_requests"] = open_now
    if reqs:
        with st.container(border=True):
            st.markdown("**Your requests**")
            for r in reqs[:6]:
                st.markdown(f"`#{r['id']}` {live.request_summary(r['kind'], r['payload'])} — **{r['text']}**")

    df = live.chart_frame(s)
    figs = charts.live_charts(df, s.metrics, s.changes, live.health_config(s.meta),
                              live.current_settings(s)["outcome_metric"])
    missing = [key for key, f in figs if f is None]
    shown = [(key, f) for key, f in figs if f is not None]
    if not shown:
        st.info("No steps logged yet." if s.last_step < 0 else "This run logged none of the charted metrics.")
    cols = st.columns(2)
    for i, (key, fig) in enumerate(shown):
        cols[i % 2].plotly_chart(fig, key=f"chart_{key}", width="stretch")
    if missing and shown:
        st.caption("Not logged by this run: " + ", ".join(missing) + ".")


@st.fragment(run_every=5.0 if first.is_live else None)  # slower: picks up new rollouts and settings
def steer():
    try:
        s = state()
    except StoreError:
        return  # monitor() above says why
    caps = live.capabilities(s)
    cur = live.current_settings(s)
    st.subheader("Reward weights, threshold" + (", difficulty" if "set_difficulty" in caps["accepts"] else ""))
    if not caps["steer"]:
        final = ", ".join(f"{m}={w:g}" for m, w in cur["weights"].items())
        st.caption(f"The run is {s.status}: nothing to steer. Settings at its last step: weights {final}; "
                   f"min_group_std {cur['min_group_std']:g}; level {cur['level']}.")
        if not caps["imported"]:
            if "set_autopilot" in caps["accepts"]:
                autopilot_moves(s, steer=False)
            save_preset_box(s, cur)
        return
    keys = {m: f"w:{run_id}:{m}" for m in cur["weights"]}
    thr_key, lvl_key = f"thr:{run_id}", f"lvl:{run_id}"

    def load_values(weights: dict, thr: float | None = None, lvl: int | None = None):
        for m, w in weights.items():
            if m in keys:
                ss[keys[m]] = round(float(w), 2)
        if thr is not None:
            ss[thr_key] = float(thr)
        if lvl is not None:
            ss[lvl_key] = int(lvl)

    # The sliders' range stays fixed per run: a changed range makes Streamlit treat them as new
    # widgets (back to 0). It only grows when a weight set elsewhere exceeds it; then re-seed.
    top_key = f"wtop:{run_id}"
    need = max(cur["weights"].values(), default=1.0)
    if ss.get(top_key, 0) < need:
        ss[top_key] = float(max(1.0, round(need * 1.5 + 0.005, 2)))
        load_values(cur["weights"], cur["min_group_std"], cur["level"])
    if any(k not in ss for k in keys.values()) or thr_key not in ss:
        load_values(cur["weights"], cur["min_group_std"], cur["level"])
    run_keys = {k: f"{k}:{run_id}" for k in live.RUN_SETTINGS}

    def load_run_values(settings: dict):
        for k, key in run_keys.items():
            if settings.get(k) is not None:
                ss[key] = float(settings[k]) if k == "temperature" else int(settings[k])

    if any(k not in ss for k in run_keys.values()):
        load_run_values(cur)
    # Settings changed elsewhere (an autopilot move, another tab, the CLI): an input the user has
    # not touched follows them (else it would offer to revert the change); an edited one is kept.
    seen_key = f"seen:{run_id}"
    prev = ss.get(seen_key)
    if prev is not None:
        as_weight = lambda v: round(float(v), 2)  # noqa: E731  (the sliders' resolution)
        inputs = {**{keys[m]: (prev["weights"].get(m), cur["weights"].get(m), as_weight) for m in keys},
                  thr_key: (prev["min_group_std"], cur["min_group_std"], float),
                  lvl_key: (prev["level"], cur["level"], int),
                  **{run_keys[k]: (prev.get(k), cur.get(k), float if k == "temperature" else int) for k in run_keys}}
        for key, (old, new, cast) in inputs.items():
            if old is not None and new is not None and old != new and ss.get(key) == cast(old):
                ss[key] = cast(new)
    ss[seen_key] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in cur.items()}
    top = ss[top_key]
    accepts = caps["accepts"]  # only the controls this run's trainer (or TRL callback) applies
    has_level = "set_difficulty" in accepts
    cols = st.columns(len(keys) + 1 + has_level)
    weights = {m: cols[i].slider(m, 0.0, float(top), step=0.01, key=keys[m]) for i, m in enumerate(keys)}
    thr = cols[len(keys)].slider("min_group_std", 0.0, 0.3, step=0.005, format="%.3f", key=thr_key,
                                 help="a group is trainable when its total-reward std is above this")
    lvl = cols[-1].slider("difficulty", 1, 4, key=lvl_key, help="demo task level (1 easy .. 4 hard); not "
                          "predictable from past rollouts") if has_level else cur["level"]
    inputs = {"group_size": lambda c: c.number_input("Group size G", 2, control.MAX_GROUP_SIZE,
                                                     key=run_keys["group_size"], help="completions per prompt; from "
                                                     "the next step"),
              "prompts_per_step": lambda c: c.number_input("Prompts per step", 1, control.MAX_PROMPTS,
                                                           key=run_keys["prompts_per_step"]),
              "temperature": lambda c: c.number_input("Temperature", 0.01, control.MAX_TEMPERATURE, step=0.05,
                                                      format="%.2f", key=run_keys["temperature"]),
              "steps": lambda c: c.number_input("Steps (budget)", 1, control.MAX_STEPS, key=run_keys["steps"],
                                                help=f"extend or shorten the run; not below the current step "
                                                     f"({s.last_step})")}
    shown = [k for k in inputs if live.RUN_SETTINGS[k] in accepts]
    rc = st.columns(4)
    run = {k: inputs[k](rc[i]) for i, k in enumerate(shown)}
    if caps["accepts_note"]:
        st.caption(caps["accepts_note"])

    try:
        wi = live.what_if(s, weights, thr)
    except ConfigError as e:
        st.error(str(e))
        wi = None
    todo = live.pending_changes(cur, weights, thr, lvl, run)
    waiting = [r for r in live.request_lines(s, my_requests()) if r["status"] in ("pending", "applying")]
    m = st.columns([2, 2, 3])
    if wi and wi["available"]:
        m[0].metric(f"What-if trainable ratio (last {wi['steps']} steps)", f"{wi['predicted']:.0%}",
                    delta=f"{(wi['predicted'] - wi['now']) * 100:+.1f} pts", help=f"{wi['groups']} groups re-scored "
                    "with the slider settings, before anything is applied")
        m[1].metric("Settings in force", f"{wi['now']:.0%}", help="the same window re-scored with the settings in force")
    else:
        m[0].caption(caps["message"] or "What-if: waiting for the first rollouts.")
    if lvl != cur["level"]:
        m[2].caption("A difficulty change alters the prompts themselves: the what-if cannot predict it.")
    if waiting:
        m[2].caption(f"Waiting for request #{waiting[-1]['id']} to be applied at the next step boundary.")
    else:
        m[2].caption("Pending change: " + ("; ".join(live.request_summary(k, p) for k, p in todo) if todo
                                           else "none (sliders equal the settings in force)"))

    b = st.columns(6)
    if b[0].button("Apply", type="primary", disabled=not todo or bool(waiting), key="apply",
                   help="one request per changed setting; the trainer applies it at the next step"):
        if all(send(kind, payload) for kind, payload in todo):
            st.toast("Sent: applied at the next step boundary")
            st.rerun()  # full rerun: the monitor shows the request as pending at once
    b[1].button("Reset sliders", key="reset", on_click=load_values,
                args=(cur["weights"], cur["min_group_std"], cur["level"]))
    if b[2].button("Suggest weights", key="suggest", disabled=not caps["what_if"]):
        try:
            ss[f"sugg:{run_id}"] = live.suggestions(s, weights, thr)
        except (ConfigError, ValueError) as e:
            st.error(str(e))
    if "pause" not in accepts:
        pass
    elif s.status == "paused":
        if b[3].button("Resume", key="resume"):
            send("resume", {})
            st.rerun()
    elif b[3].button("Pause", key="pause"):
        send("pause", {})
        st.rerun()
    if b[4].button("Stop", key="stop", help="finish the current step, checkpoint, stop"):
        send("stop", {})
        st.rerun()

    sugg = ss.get(f"sugg:{run_id}")
    if sugg is not None:
        if not sugg:
            st.caption("No weights near these would make more groups trainable in the recent window.")
        for i, sg in enumerate(sugg):
            c = st.columns([5, 1])
            c[0].markdown(f"**{sg['predicted_ratio']:.0%}** predicted (now {sg['current_ratio']:.0%}): "
                          + ", ".join(f"{k}={v:.2f}" for k, v in sg["weights"].items()) + f"  \n{sg['why']}")
            c[1].button("Load", key=f"load_sugg_{i}", on_click=load_values, args=(sg["weights"],))

    if "set_autopilot" in accepts:
        autopilot_moves(s, steer=True)
    save_preset_box(s, cur)


def autopilot_moves(s: live.LiveState, steer: bool):
    """The autopilot switch and its moves, each with its reason and an Undo (the inverse request)."""
    cur = live.current_settings(s)
    st.subheader("Autopilot")
    if steer:
        ap_key, seen = f"ap:{run_id}", f"ap_seen:{run_id}"
        if ss.get(seen) != cur["autopilot"]:  # applied (or changed elsewhere): the switch shows it
            ss[ap_key] = ss[seen] = cur["autopilot"]
        st.toggle("Autopilot on", key=ap_key, on_change=lambda: send("set_autopilot", {"enabled": bool(ss[ap_key])}),
                  help="acts on the health verdict with requests (reweight, raise G within a budget, widen "
                       "sampling, raise difficulty, stop early); every move is listed here with its reason and can "
                       "be undone")
    moves = live.autopilot_moves(s)
    if not moves:
        st.caption("No autopilot moves" + ("." if cur["autopilot"] else ": it is off."))
    for m in moves[:10]:
        c = st.columns([8, 1])
        undone = f" · undone by #{m['undone_by']}" if m["undone_by"] else ""
        c[0].markdown(f"`#{m['request_id']}` after step {m['step']} · **{m['summary']}** — {m['status']}{undone}"
                      f"  \n{m['reason']}")
        if steer and m["undo"] and c[1].button("Undo", key=f"undo_{m['request_id']}",
                                               help="send the inverse request (source ui)"):
            if send(*m["undo"]):
                st.rerun()


def save_preset_box(s: live.LiveState, cur: dict):
    with st.expander("Save these settings as a preset"):
        st.caption("Weights, group size and threshold in force, as a TOML file under the runs dir's presets/ "
                   "(start a run from it on the Runs page).")
        name = st.text_input("Preset name", key=f"preset_name:{run_id}", placeholder="e.g. cite-less")
        if st.button("Save preset", key="save_preset", disabled=not name.strip()):
            try:
                path = presets.save_preset(name.strip(), cur["weights"], cur.get("group_size"), cur["min_group_std"],
                                           note=f"from run {run_id} at step {s.last_step}", source_run=run_id)
                st.success(f"saved preset {name.strip()} ({path})")
            except ConfigError as e:
                st.error(str(e))


monitor()
steer()
