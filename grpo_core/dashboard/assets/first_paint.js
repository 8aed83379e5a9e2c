// The live page's first paint (grpo_core.dashboard.first_paint): the run's first chart, drawn from
// its bytes in the HTML before Streamlit's app has loaded, by live_chart.js' own decode and build
// (this file runs after it, in the same function scope). The preview goes once the page shows what
// it drew itself: one of its charts, an error or alert, or another page (the reader followed a
// link), or after first_paint.EXPIRE_S whatever happens (CSS hides it then too, should this not run).
{
  const box = document.getElementById("grpo-first-paint");
  const bytesOf = text => {
    const raw = atob(text.trim()), bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes;
  };
  const pageShows = () => location.pathname !== "/" ||
    document.querySelector('#root .live-chart canvas, #root [data-testid="stException"], #root [data-testid="stAlert"]');
  if (box && !pageShows()) {
    const host = box.querySelector(".first-paint-chart");
    const chart = build(host, decode(bytesOf(document.getElementById("grpo-first-paint-data").textContent)));
    const watch = new MutationObserver(() => { if (pageShows()) done(); });
    const done = () => {
      if (!box.isConnected) return;
      watch.disconnect();
      chart.resized.disconnect();
      chart.destroy();
      box.remove();
    };
    watch.observe(document.getElementById("root"), {childList: true, subtree: true});
    setTimeout(done, 1000 * Number(box.dataset.expireS));
  } else if (box) {
    box.remove();
  }
}
