// A fragment's next refresh, asked by the page once it has drawn this one. Streamlit's run_every
// asks on a fixed timer whether or not the page has drawn the last answer, so a browser short of
// CPU queues refreshes and falls ever further behind the run; this element asks `every` seconds
// after its fragment's output reached the page (it is the fragment's last element), so a slow
// page refreshes less often instead. Runs in the page (a Streamlit components-v2 element); `data`
// is {every: seconds, n: this session's refresh count (new data, so each refresh runs this)}.
const RETRY = 3;  // no answer within RETRY periods (a request lost to a reconnect): ask again

export default function render({data, setTriggerValue, parentElement}) {
  const host = parentElement;
  const token = host.refreshToken = {};  // this render's; a later render or the unmount ends it
  const current = () => host.refreshToken === token;
  clearTimeout(host.refreshTimer);
  const ask = () => {
    if (!current()) return;
    setTriggerValue("due", data.n);
    host.refreshTimer = setTimeout(ask, Math.max(10, RETRY * data.every) * 1000);
  };
  // after the frame that paints this refresh: the wait starts once the reader can see it
  requestAnimationFrame(() => { if (current()) host.refreshTimer = setTimeout(ask, data.every * 1000); });
  // Unmounted (the run ended, the page's first paint gave way to the whole page): ask no more. An
  // element no longer on the page would rerun the whole page, not its fragment.
  return () => {
    if (current()) {
      host.refreshToken = null;
      clearTimeout(host.refreshTimer);
    }
  };
}
