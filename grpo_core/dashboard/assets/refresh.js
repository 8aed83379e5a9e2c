// A fragment's next refresh, asked by the page once it has drawn this one. Streamlit's run_every
// asks on a fixed timer whether or not the page has drawn the last answer, so a browser short of
// CPU queues refreshes and falls ever further behind the run; this element asks `every` seconds
// after its fragment's output reached the page (it is the fragment's last element), so a slow
// page refreshes less often instead. A page nobody can see (a background tab, a minimised window)
// asks nothing until it is seen again, then at once: a tab left open costs neither the server nor
// the browser. Given a probe (live_probe's route) and the key its fragment drew, a due refresh asks
// the probe first and reruns only when the run's key changed: a rerun redraws the whole page, a
// probe is a few bytes. Runs in the page (a Streamlit components-v2 element); `data` is
// {every: seconds, n: this session's refresh count (new data, so each refresh runs this),
// probe and drawn (optional): the URL answering {key} and the key this run drew, ready (optional):
// a CSS selector, the wait starts once the page holds an element it matches (READY_MS at most)}.
const RETRY = 3;  // no answer within RETRY periods (a request lost to a reconnect): ask again
const patience = data => Math.max(10, RETRY * data.every) * 1000;  // that wait in ms, 10 s at least
const READY_MS = 15000;  // an element `ready` names that never comes (a chart that failed to draw): go on

async function changed(data) {
  try {  // a hung server: given up after RETRY periods, as a rerun that gets no answer is asked again
    const answer = await fetch(data.probe, {cache: "no-store", credentials: "same-origin",
                                            signal: AbortSignal.timeout(patience(data))});
    return !answer.ok || (await answer.json()).key !== data.drawn;
  } catch (error) {
    return true;  // no answer (a restarted server, a lost network): the rerun shows what is wrong
  }
}

function stopWaiting(host) {
  clearTimeout(host.refreshTimer);
  if (host.readyWatch) host.readyWatch.disconnect();
  host.readyWatch = null;
  if (host.refreshOnShow) document.removeEventListener("visibilitychange", host.refreshOnShow);
  host.refreshOnShow = null;
}

export default function render({data, setTriggerValue, parentElement}) {
  const host = parentElement;
  const token = host.refreshToken = {};  // this render's; a later render or the unmount ends it
  const current = () => host.refreshToken === token;
  stopWaiting(host);
  const ask = () => {
    if (!current()) return;
    if (document.visibilityState === "hidden") {  // nobody looks: ask once somebody does
      stopWaiting(host);
      host.refreshOnShow = () => {
        if (document.visibilityState === "hidden") return;
        stopWaiting(host);
        ask();
      };
      document.addEventListener("visibilitychange", host.refreshOnShow);
      return;
    }
    if (data.probe) {
      changed(data).then(yes => {
        if (!current()) return;
        if (yes) rerun();
        else host.refreshTimer = setTimeout(ask, data.every * 1000);  // nothing new: ask again later
      });
    } else {
      rerun();
    }
  };
  const rerun = () => {
    setTriggerValue("due", data.n);
    host.refreshTimer = setTimeout(ask, patience(data));
  };
  const start = () => {
    if (!current()) return;
    stopWaiting(host);
    if (document.visibilityState === "hidden") {
      ask();  // drawn unseen (a refresh in flight when the tab was left): wait for the reader
    } else {  // after the frame that paints this refresh: the wait starts once the reader can see it
      requestAnimationFrame(() => { if (current()) host.refreshTimer = setTimeout(ask, data.every * 1000); });
    }
  };
  if (data.ready && !document.querySelector(data.ready)) {  // e.g. the first chart, still drawing
    host.readyWatch = new MutationObserver(() => { if (document.querySelector(data.ready)) start(); });
    host.readyWatch.observe(document.body, {childList: true, subtree: true});
    host.refreshTimer = setTimeout(start, READY_MS);
  } else {
    start();
  }
  // Unmounted (the run ended, the page's first paint gave way to the whole page): ask no more. An
  // element no longer on the page would rerun the whole page, not its fragment.
  return () => {
    if (current()) {
      host.refreshToken = null;
      stopWaiting(host);
    }
  };
}
