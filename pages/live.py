"""Live monitor: health cards, charts, alerts and the weight sliders of one run.

Layout and widgets only: grpo_core.dashboard.live_cache gives every viewer the same view of the run
(live_view's incremental read, done once per change, behind one cheap "anything new?" probe) and
the same figures per version, live_cards, advice and request_view compute what is shown,
grpo_core.dashboard.widget_state keeps the sliders' and inputs' session state in step with the run
(and gives their bounds), grpo_core.analysis.charts builds the figures (smoothed by the page's EMA
slider; long history by bins with their min and max, every step on request) and live_chart draws
them with uPlot in the page (a refresh hands each chart new data: a reader's zoom stays), and
advice.what_to_do gives the top alert's fix, offered here as one button. The charts refresh while
the run is live (a fragment, so the sliders below are not disturbed), each refresh asked by the
page once it drew the last one (refresh.after): every 2 s, and only if the run changed since
(live_probe's "anything new?" route, a few bytes); served without the route, at the run's pace
(2-10 s: live_cache.refresh_interval). A finished run is drawn once. Below, only the what-if line
refreshes on its own (what_if_now); the steering controls are redrawn when used or when what they
show changed.
"""
import secrets

import streamlit as st

from grpo_core.analysis import charts
from grpo_core.dashboard import (advice, frame, live_cache, live_cards, live_chart, live_probe, live_view, processes,
                                 refresh, request_view, run_list, widget_state)
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs import live_settings, presets, requests
from grpo_core.runs.locations import runs_dir
from grpo_core.runs.run_meta import error_line

run_id = frame.open_page()
ss = st.session_state
st.header("Live monitor")

if not run_id:
    st.info("No run yet. Start the built-in demo (a tiny model learning a cite-your-source task with five reward "
            "metrics, a step a second) or SmolLM2 learning sums (a real 135M-parameter instruct model, about 10 s a "
            "step on 2 cores), on this machine's CPU (a GPU when there is one).")
    c = st.columns(2)
    for which, label, col, kind in (("builtin", "Start the demo run", c[0], "primary"),
                                    ("smollm2", "Start SmolLM2 learning sums", c[1], "secondary")):
        if col.button(label, type=kind, key="start_demo" if which == "builtin" else f"start_demo_{which}"):
            try:
                ss["goto_run"], _ = processes.start_demo_if_idle(which=which)
                st.rerun()
            except (ConfigError, StoreError) as e:
                st.error(str(e))
    st.stop()

# uPlot for the charts, once per page (an element outside the fragments: not resent), and first: the
# browser takes it in while the charts' data is on its way, and each chart draws as its data arrives.
live_chart.load()
RUN_DIR = runs_dir() / run_id
STEER_REFRESH_S = 5.0  # the steering panel's shortest period while the run is live: new rollouts, settings made elsewhere
PAINTED = widget_state.PAINTED  # this session has had its first paint of this page (see the end)
CHARTS_SENT = "live_charts_sent"  # what this session's charts were sent (live_chart.draw_charts)
if frame.entered_page():  # a new visit: the browser mounts the charts anew, holding none of them
    ss.pop(CHARTS_SENT, None)
VIEWER = ss.setdefault("live_viewer", secrets.token_hex(8))  # this session, one of the run's viewers (their share of redraws)
PROBE = live_probe.url(run_id, VIEWER)  # the route a refresh asks "anything new?" before it reruns (None: app.py served alone)


def state() -> live_view.LiveState:
    """The run as every viewer of this dashboard sees it (live_cache: one cheap "anything new?"
    probe per run and period, one incremental read per change, shared by all sessions; read-only)."""
    return live_cache.current(RUN_DIR)


def shared(s: live_view.LiveState, *key, fn):
    """fn() once per view of the run and its arguments, for every session (live_cache.memo): what
    depends on the state alone is not recomputed by each viewer at each refresh."""
    return live_cache.memo(RUN_DIR, (s.version, s.status, *key), fn)


def chart_update(key, fn):
    """A chart's update, made once for every viewer that holds the same version of it (live_cache)."""
    return live_cache.chart_update(RUN_DIR, key, fn)


def refresh_after(period: float | None, key: str, s: live_view.LiveState | None):
    """The fragment's next refresh: `period` after the page drew it, and only if the run changed
    since `s` (live_probe); without a state drawn (the store unreadable), at each period."""
    if s is None:
        refresh.after(period, key=key)
    else:
        refresh.after(period, key=key, probe=PROBE, drawn=live_probe.key(s))


def my_requests() -> list[int]:
    return widget_state.my_requests(ss, run_id)


def my_open_requests(s: live_view.LiveState) -> list[dict]:
    """This session's requests the trainer has not resolved yet (request_view's lines)."""
    return widget_state.open_requests(request_view.request_lines(s, my_requests()))


# Every button acts in its callback, which Streamlit runs before the run its click starts: that run
# may be cut short before it reaches the button (the what-if finds a setting applied elsewhere, the
# run ended: st.rerun), and a click read from the button's return value would then be lost.
def send(kind: str, payload: dict, where: str) -> bool:
    """This session's request to the run; a bad one is told at `where` (tell), nothing sent."""
    try:
        my_requests().append(requests.send(RUN_DIR, kind, payload, source="ui"))
        live_cache.expire(RUN_DIR)  # the rerun that follows shows the request as pending at once
        return True
    except (ConfigError, StoreError) as e:
        tell(where, "error", str(e))
        return False


SENT = "Sent: applied at the next step boundary"  # a request's toast


def act(kind: str, payload: dict, where: str, done: str = SENT):
    """A button's callback that sends one request, then reruns the whole page (st.rerun from a
    callback): the monitor shows the request as pending at once."""
    if send(kind, payload, where):
        st.toast(done)
        st.rerun()


def tell(where: str, level: str, text: str):
    """What a callback has to say (an error, a preset saved), drawn by told(where) at the next run."""
    ss[f"told:{where}"] = (level, text)


def told(where: str):
    """Draw, once, what a callback told at `where`."""
    level, text = ss.pop(f"told:{where}", (None, None))
    if text:
        (st.error if level == "error" else st.success)(text)


try:
    LIVE = state().is_live  # a bool, read now: a LiveState's status follows its heartbeat's age
except StoreError as e:
    st.error(str(e))
    st.stop()
RETRY_S = STEER_REFRESH_S if LIVE else None  # a steering part that could not draw tries again (not once the run ended)


@st.fragment
def monitor() -> bool:
    """The run's cards, alerts and charts, refreshed at the run's pace once the page drew them
    (refresh.after: a page short of CPU refreshes less often instead of queueing refreshes);
    whether it sent charts to draw."""
    s, sent = None, 0
    with refresh.steady("monitor"):
        with refresh.guarded("the run's cards and charts"):
            s, sent = monitor_panel()
        if s is None:  # the store could not be read, or a bug: try again while the run was live
            period = live_cache.STALE_REFRESH_S if LIVE else None
        else:  # the run's pace, slower for a view too large to resend at that pace (every step of a long run)
            period = live_chart.paced(live_cache.refresh_interval(s, probed=PROBE is not None, viewer=VIEWER), sent)
        refresh_after(period, "monitor_refresh", s)
    return sent > 0


def monitor_panel() -> tuple[live_view.LiveState | None, int]:
    """The panel, and the bytes of chart data it sent."""
    try:
        s = state()
    except StoreError as e:  # the run was deleted or damaged while we watched
        st.error(str(e))
        return None, 0
    if s.is_live != LIVE:  # ended or came back: the whole page changes
        st.rerun()
    c = shared(s, "cards", fn=lambda: live_cards.cards(s))
    caps = live_cards.capabilities(s)
    # One container for each part above the charts, drawn or left empty: the charts keep their place
    # on the page when an alert, a request line or the first paint's rest comes or goes, so they
    # stay the same element and each uPlot chart (with a reader's zoom) takes the new data in place.
    line_box, health_box, controls_box = st.container(), st.container(), st.container()
    with line_box:
        run_line(s, c, caps)
    if ss.get(PAINTED):
        with health_box:
            health(s, c, caps)
        with controls_box:
            smooth, raw = chart_controls()
    else:  # the session's first paint: the run and its charts, the rest right after (see the page's end)
        smooth, raw = ss.get("smoothing", charts.DEFAULT_SMOOTHING), ss.get("raw_steps", False)
    return s, chart_grid(s, smooth, raw)


def run_line(s: live_view.LiveState, c: live_cards.Cards, caps: dict):
    """The run, its status, settings and progress, and what its status means."""
    top = st.columns([3, 2])
    setup = run_list.config_summary(s.meta, live_view.current_settings(s))  # the settings in force
    top[0].markdown(f"**{run_id}** · {live_cards.status_badge(c.status)} · {setup}")
    if c.steps:
        eta = "runs until you stop it" if c.steps >= processes.UNTIL_STOPPED else f"ETA {live_cards.fmt_eta(c.eta_s)}"
        top[1].progress(c.progress, text=f"step {c.step or 0} of {c.steps} · {eta}")
    if c.status == "failed":
        st.error(f"The run failed: {error_line(s.meta) or 'no error recorded'}")
    elif c.status == "stale":
        st.warning("No heartbeat from the trainer: it may have crashed or been killed. See the Runs page.")
    elif c.status == "created":
        st.info("The trainer is starting (loading the model; the built-in one warms up once, ~30 s).")
    if caps["message"]:
        st.info(caps["message"])


def health(s: live_view.LiveState, c: live_cards.Cards, caps: dict):
    """The health cards, the verdict, the alerts, the top alert's fix and this session's requests."""
    wasted = live_cards.wasted_text(s)
    if wasted:
        st.caption(wasted)
    pct = lambda v: "–" if v is None else f"{v:.0%}"  # noqa: E731
    k = st.columns(5)
    k[0].metric("Trainable ratio (step)", pct(c.ratio), help=f"trainable / submitted groups at the last step, from {c.ratio_source}")
    k[1].metric("Trainable ratio (cumulative)", pct(c.cum_ratio), help="over the whole run so far")
    k[2].metric("Mean group reward std", "–" if c.reward_std is None else f"{c.reward_std:.3f}",
                help="mean within-group std of the total reward over the health window")
    k[3].metric("Reward trend", live_cards.TREND_ARROWS[c.trend] + ("" if c.reward is None else f" {c.reward:.3f}"),
                help=c.trend_text or "needs a few steps")
    k[4].metric("Groups trainable / submitted", "–" if c.submitted is None else f"{c.trainable} / {c.submitted}")

    verdict = {"healthy": st.success, "warning": st.warning, "critical": st.error}.get(c.verdict, st.info)
    verdict(f"**{c.verdict.upper()}** · " + " · ".join(ch.text for ch in c.checks if ch.text)
            if c.checks else "Not enough steps yet to judge.")
    for a in c.alerts:
        (st.error if a.severity == "critical" else st.warning)(f"{a.message} (step {a.step})")
    if caps["steer"]:
        what_to_do_now(s, c, caps["accepts"])

    reqs = request_view.request_lines(s, my_requests())
    if widget_state.request_resolved(ss, reqs):  # one of ours was just resolved: redraw the sliders too
        st.rerun()
    if reqs:
        with st.container(border=True):
            st.markdown("**Your requests**")
            for r in reqs[:6]:
                st.markdown(f"`#{r['id']}` {live_settings.describe(r['kind'], r['payload'])} — **{r['text']}**")


def chart_controls() -> tuple[float, bool]:
    """The charts' smoothing slider and every-step toggle: their values."""
    row = st.columns([4, 1])
    smooth = row[0].slider("Chart smoothing", 0.0, 0.99, charts.DEFAULT_SMOOTHING, 0.01, key="smoothing",
                           help="Exponential moving average of every measured series, debiased as W&B's and "
                                "TensorBoard's (0 = raw); the raw values stay as a faint line (in old history, "
                                "each bin's min and max, so no spike is lost)")
    raw = row[1].toggle("Every step (raw)", key="raw_steps", help="read every step from the store instead of the "
                        "binned history (long runs: slower to draw, refreshed less often, at most "
                        f"{live_chart.SEND_RATE // 1000} kB/s; cut to 20,000 points per line by min/max)")
    return smooth, raw


def chart_grid(s: live_view.LiveState, smooth: float, raw: bool) -> int:
    """The run's charts, two per row in one element (live_chart: uPlot, built per version for every
    viewer; each chart sent only the rows it lacks, made once for the viewers that hold the same,
    and nothing when it holds them all); the bytes of chart data sent."""
    specs = live_cache.chart_specs(RUN_DIR, s, smooth, raw_steps(s) if raw else None)
    missing = [key for key, chart in specs if chart is None]
    shown = [(key, chart) for key, chart in specs if chart is not None]
    if not shown:
        st.info("No steps logged yet." if s.last_step < 0 else "This run logged none of the charted metrics.")
    sent = live_chart.draw_charts(shown, "charts", ss.setdefault(CHARTS_SENT, {}), memo=chart_update) if shown else 0
    if missing and shown:
        st.caption("Not logged by this run: " + ", ".join(missing) + ".")
    return sent


def raw_steps(s: live_view.LiveState):
    """Every step of the charted names, for this session while its toggle is on: read once, then
    only the steps added since (nothing at a tick with no new step)."""
    version, frame = ss.get("raw_frame", (None, None))
    if version != s.version:
        ss["raw_frame"] = (s.version, live_view.raw_frame(RUN_DIR, s.names, prev=frame))
    return ss["raw_frame"][1]


def what_to_do_now(s: live_view.LiveState, c: live_cards.Cards, accepts):
    """The top alert's fix as one click (what the autopilot would do), with its predicted effect;
    only fixes the process behind the run applies (a TRL callback takes no group-size request)."""
    answer = shared(s, "what_to_do", s.rollout_step, fn=lambda: advice.what_to_do(s, c))  # for every viewer
    if answer is None:
        return
    offered = [f for f in answer["fixes"] if f.kind in accepts]
    with st.container(border=True):
        st.markdown(f"**What to do now** · for: _{answer['alert'].message.split(':')[0]}_")
        if not offered:
            st.caption("No single move answers it now: " + "; ".join(answer["why_not"]) + ".")
        for i, f in enumerate(offered[:3]):
            row = st.columns([2, 5])
            row[0].button(f.label, key=f"fix_{f.move}", type="primary" if i == 0 else "secondary", help=f.reason,
                          width="stretch", on_click=act,
                          args=(f.kind, f.payload, "fixes", f"Sent {f.label}: applied at the next step boundary"))
            row[1].caption(f.note)
        told("fixes")
        note = advice.autopilot_note(s, offered[:3])  # about the buttons shown
        if note:
            st.caption(note)


@st.fragment
def steer():
    """The steering panel: a control's change reruns it. Only its what-if part refreshes on its
    own (what_if_now); a change to what the controls show reruns the page."""
    if not ss.get(PAINTED):
        return  # the page's first paint: the panel comes right after
    refreshing, s = False, None
    with refresh.guarded("the steering panel"):
        refreshing, s = steer_panel()
    if not refreshing:  # no what-if part refreshing it (a run it cannot steer, the store unreadable, a bug)
        refresh_after(RETRY_S, "steer_retry", s)


def steer_panel() -> tuple[bool, live_view.LiveState | None]:
    """The panel; whether its what-if part is on it (what_if_now: the panel's refresh), and the state drawn."""
    try:
        s = state()
    except StoreError:
        return False, None  # monitor() above says why
    caps = live_cards.capabilities(s)
    cur = live_view.current_settings(s)
    st.subheader("Reward weights, threshold" + (", difficulty" if "set_difficulty" in caps["accepts"] else ""))
    if not caps["steer"]:
        settled(s, cur, caps)
        return False, s
    keys = widget_state.sync(ss, run_id, cur)  # seed the widgets, follow changes made elsewhere
    weights, thr, lvl, run = sliders(cur, caps["accepts"], keys)
    if caps["accepts_note"]:
        st.caption(caps["accepts_note"])
    todo = request_view.pending_changes(cur, weights, thr, lvl, run)
    waiting = my_open_requests(s)
    what_if_now(weights, thr, lvl != cur["level"], run.get("group_size") or cur.get("group_size"), todo,
                drawn=steer_inputs(s, cur, caps, waiting))
    buttons(s, caps, cur, keys, todo, waiting)
    suggestions_box(s, keys)
    if "set_autopilot" in caps["accepts"]:
        autopilot_moves(s, steer=True)
    save_preset_box(s, cur)
    return True, s


def steer_inputs(s: live_view.LiveState, cur: dict, caps: dict, waiting: list) -> str:
    """What the steering panel's controls were drawn from: the settings in force (cur), the run's
    status and what it can show (caps), this session's open requests (waiting) and the autopilot's moves."""
    return repr((s.status, cur, caps["what_if"], waiting,
                 [(m["request_id"], m["status"], m["undone_by"]) for m in request_view.autopilot_moves(s)]))


@st.fragment
def what_if_now(weights: dict, thr: float, level_changed: bool, group_size, todo: list, drawn: str):
    """The slider settings' what-if and flat-group forecast on the newest rollouts, refreshed alone
    (the controls above are not redrawn) at the run's pace, at most every STEER_REFRESH_S; when
    what the controls were drawn from changed (a setting applied, made in another tab or by the
    autopilot; a request resolved), the page."""
    period, s = RETRY_S, None
    with refresh.steady("what_if"):
        with refresh.guarded("the what-if"):
            period, s = what_if_part(weights, thr, level_changed, group_size, todo, drawn)
        refresh_after(period, "steer_refresh", s)


def what_if_part(weights: dict, thr: float, level_changed: bool, group_size, todo: list,
                 drawn: str) -> tuple[float | None, live_view.LiveState | None]:
    """The what-if line and the flat-group forecast; the period of the next refresh, and the state drawn."""
    try:
        s = state()
    except StoreError:
        return RETRY_S, None  # monitor() above says why
    caps = live_cards.capabilities(s)
    waiting = my_open_requests(s)
    if steer_inputs(s, live_view.current_settings(s), caps, waiting) != drawn:
        st.rerun()
    try:
        wi = shared(s, "what_if", s.rollout_step, tuple(weights.items()), thr, fn=lambda: advice.what_if(s, weights, thr))
    except ConfigError as e:
        st.error(str(e))
        wi = None
    what_if_line(wi, caps, level_changed, todo, waiting)
    flat_line(s, group_size)
    return what_if_period(s), s


def what_if_period(s: live_view.LiveState) -> float | None:
    """The monitor's poll period, at least STEER_REFRESH_S (live_cache.what_if_interval): the what-if
    window's rollouts change once per step, so without the route a run of a step a minute has its
    what-if redrawn every 10 s, not every 5 s (each redraw is the whole page's work for its
    browser); with it, every 5 s it asks and redraws once per step; with many viewers, half as
    often as the charts."""
    return live_cache.what_if_interval(s, STEER_REFRESH_S, probed=PROBE is not None, viewer=VIEWER)


def settled(s: live_view.LiveState, cur: dict, caps: dict):
    """A run that cannot be steered (finished, stale, imported): its last settings."""
    final = ", ".join(f"{m}={w:g}" for m, w in cur["weights"].items())
    st.caption(f"The run is {s.status}: nothing to steer. Settings at its last step: weights {final}; "
               f"min_group_std {cur['min_group_std']:g}; level {cur['level']}.")
    if not caps["imported"]:
        if "set_autopilot" in caps["accepts"]:
            autopilot_moves(s, steer=False)
        save_preset_box(s, cur)


def sliders(cur: dict, accepts, keys: widget_state.Keys):
    """The weight, threshold and level sliders and the run-setting inputs the run accepts
    (only the controls its trainer, or TRL callback, applies): their values."""
    top = ss[keys.top]
    has_level = "set_difficulty" in accepts
    cols = st.columns(len(keys.weights) + 1 + has_level)
    for i, (m, key) in enumerate(keys.weights.items()):
        cols[i].slider(**widget_state.weight_spec(m, top), key=key)
    cols[len(keys.weights)].slider(**widget_state.threshold_spec(), key=keys.thr)
    if has_level:
        cols[-1].slider(**widget_state.level_spec(), key=keys.lvl)
    shown = widget_state.run_inputs(accepts)
    rc = st.columns(max(4, len(shown)))
    for i, k in enumerate(shown):
        rc[i].number_input(**widget_state.run_input_spec(live_view.RUN_SETTINGS[k]), key=keys.run[k])
    return widget_state.shown_values(ss, keys, accepts, cur)  # what a button's callback reads too


def what_if_line(wi: dict | None, caps: dict, level_changed: bool, todo: list, waiting: list):
    """The what-if ratio of the slider settings beside the settings in force, and what Apply sends."""
    m = st.columns([2, 2, 3])
    if wi and wi["available"]:
        m[0].metric(f"What-if trainable ratio (last {wi['steps']} steps)", f"{wi['predicted']:.0%}",
                    delta=f"{(wi['predicted'] - wi['now']) * 100:+.1f} pts", help=f"{wi['groups']} groups re-scored "
                    "with the slider settings, before anything is applied")
        m[1].metric("Settings in force", f"{wi['now']:.0%}", help="the same window re-scored with the settings in force")
    else:
        m[0].caption(caps["message"] or "What-if: waiting for the first rollouts.")
    if level_changed:
        m[2].caption("A difficulty change alters the prompts themselves: the what-if cannot predict it.")
    if waiting:
        m[2].caption(f"Waiting for request #{waiting[-1]['id']} to be applied at the next step boundary.")
    else:
        m[2].caption("Pending change: " + ("; ".join(live_settings.describe(k, p) for k, p in todo) if todo
                                           else "none (sliders equal the settings in force)"))


def flat_line(s: live_view.LiveState, group_size):
    """Flat groups in the what-if window: measured, and predicted at the G input from one pooled
    success rate and from each prompt's own rate (prompts differ: the pooled one under-predicts)."""
    if not group_size:
        return  # an imported run that did not log its G
    try:
        f = shared(s, "flat_forecast", s.rollout_step, int(group_size),
                   fn=lambda: advice.flat_forecast(s, int(group_size)))
    except (StoreError, ValueError) as e:
        st.caption(f"Flat-group forecast unavailable: {e}")
        return
    if not f["available"] or f["measured"] is None or f["pooled"] is None:
        return
    st.caption(f"Flat groups ({f['metric']} all 0 or all 1), last {f['steps']} steps: measured **{f['measured']:.0%}**; "
               f"predicted at G = {f['G']}: one pooled rate **{f['pooled']:.0%}**, each of the {f['prompts']} prompts "
               f"at its own rate **{f['per_prompt']:.0%}**.")


def buttons(s: live_view.LiveState, caps: dict, cur: dict, keys: widget_state.Keys, todo: list, waiting: list):
    """Apply (one request per changed setting), Reset, Suggest, Pause/Resume, Stop."""
    accepts = caps["accepts"]
    b = st.columns(6)
    b[0].button("Apply", type="primary", disabled=not todo or bool(waiting), key="apply", on_click=apply_sliders,
                args=(keys, accepts), help="one request per changed setting; the trainer applies it at the next step")
    b[1].button("Reset sliders", key="reset", on_click=widget_state.load_values,
                args=(ss, keys, cur["weights"], cur["min_group_std"], cur["level"]))
    b[2].button("Suggest weights", key="suggest", disabled=not caps["what_if"], on_click=suggest, args=(keys, accepts))
    if "pause" in accepts:
        label, kind = ("Resume", "resume") if s.status == "paused" else ("Pause", "pause")
        b[3].button(label, key=kind, on_click=act, args=(kind, {}, "buttons"))
    b[4].button("Stop", key="stop", help="finish the current step, checkpoint, stop", on_click=act,
                args=("stop", {}, "buttons"))
    told("buttons")


def apply_sliders(keys: widget_state.Keys, accepts):
    """Apply's callback: one request per setting the controls show changed from the one in force
    (a second click before the first's redraw, while a request of ours is open, sends nothing)."""
    try:
        s = state()
    except StoreError as e:
        return tell("buttons", "error", str(e))
    cur = live_view.current_settings(s)
    if my_open_requests(s):
        return
    todo = request_view.pending_changes(cur, *widget_state.shown_values(ss, keys, accepts, cur))
    if todo and all(send(kind, payload, "buttons") for kind, payload in todo):
        st.toast(SENT)
        st.rerun()


def suggest(keys: widget_state.Keys, accepts):
    """Suggest weights' callback: weights near the sliders' that make more groups trainable."""
    try:
        s = state()
        weights, thr, _, _ = widget_state.shown_values(ss, keys, accepts, live_view.current_settings(s))
        ss[keys.suggestions] = advice.suggestions(s, weights, thr)
    except (ConfigError, StoreError, ValueError) as e:
        tell("buttons", "error", str(e))


def suggestions_box(s: live_view.LiveState, keys: widget_state.Keys):
    sugg = ss.get(keys.suggestions)
    if sugg is None:
        return
    if not sugg:
        st.caption("No weights near these would make more groups trainable in the recent window. "
                   + advice.what_would_help(s))
    for i, sg in enumerate(sugg):
        c = st.columns([5, 1])
        c[0].markdown(f"**{sg['predicted_ratio']:.0%}** predicted (now {sg['current_ratio']:.0%}): "
                      + ", ".join(f"{k}={v:.2f}" for k, v in sg["weights"].items()) + f"  \n{sg['why']}")
        c[1].button("Load", key=f"load_sugg_{i}", on_click=widget_state.load_values, args=(ss, keys, sg["weights"]))


def autopilot_moves(s: live_view.LiveState, steer: bool):
    """The autopilot switch and its moves, each with its reason and an Undo (the inverse request)."""
    cur = live_view.current_settings(s)
    st.subheader("Autopilot")
    if steer:
        ap_key = widget_state.sync_autopilot(ss, widget_state.keys(run_id), cur["autopilot"])
        st.toggle("Autopilot on", key=ap_key,
                  on_change=lambda: send("set_autopilot", {"enabled": bool(ss[ap_key])}, "autopilot"),
                  help="acts on the health verdict with requests (reweight, raise G within a budget, widen "
                       "sampling, raise difficulty, stop early); every move is listed here with its reason and can "
                       "be undone")
    moves = request_view.autopilot_moves(s)
    if not moves:
        st.caption("No autopilot moves" + ("." if cur["autopilot"] else ": it is off."))
    for m in moves[:10]:
        c = st.columns([8, 1])
        undone = f" · undone by #{m['undone_by']}" if m["undone_by"] else ""
        c[0].markdown(f"`#{m['request_id']}` after step {m['step']} · **{m['summary']}** — {m['status']}{undone}"
                      f"  \n{m['reason']}")
        if steer and m["undo"]:
            c[1].button("Undo", key=f"undo_{m['request_id']}", help="send the inverse request (source ui)",
                        on_click=act, args=(*m["undo"], "autopilot"))
    told("autopilot")


def save_preset_box(s: live_view.LiveState, cur: dict):
    with st.expander("Save these settings as a preset"):
        st.caption("Weights, group size and threshold in force, as a TOML file under the runs dir's presets/ "
                   "(start a run from it on the Runs page).")
        name = st.text_input("Preset name", key=widget_state.keys(run_id).preset_name, placeholder="e.g. cite-less")
        st.button("Save preset", key="save_preset", disabled=not name.strip(), on_click=save_preset,
                  args=(cur, s.last_step))
        told("preset")


def save_preset(cur: dict, step: int):
    """Save preset's callback: the settings in force the box showed, under the name typed."""
    name = ss.get(widget_state.keys(run_id).preset_name, "").strip()
    try:
        path = presets.save_preset(name, cur["weights"], cur.get("group_size"), cur["min_group_std"],
                                   note=f"from run {run_id} at step {step}", source_run=run_id)
        tell("preset", "success", f"saved preset {name} ({path})")
    except ConfigError as e:
        tell("preset", "error", str(e))


charted = monitor()
steer()
if not ss.get(PAINTED):  # the rest of the page, asked for once the browser drew the run's first chart
    ss[PAINTED] = True  # (its rest, and the JS that draws it, would compete with that chart for the browser)
    refresh.after(0.0, key="first_paint", ready=live_chart.DRAWN if charted else None)
