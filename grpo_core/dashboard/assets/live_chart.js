// The live page's charts: one uPlot per chart, kept across the page's refreshes. A refresh hands
// the same chart new columns (setData), so a reader's zoom (drag on x; double-click resets) and the
// legend's toggles survive, where rebuilding the chart would reset them. Runs in the page: the
// library element (live_chart.load) defines `grpoHealthLiveChart`, which the charts element (a
// Streamlit components-v2 element, live_chart.CHART_JS) calls with its data: live_chart.pack's
// bytes (unpack reads them), a directory of the charts and, for each chart sent something,
// grpo_core.dashboard.live_chart.encode's bytes of live_chart.spec's dict, whole or the rows the
// chart lacks (decode reads them, withHeld joins them to the rows it holds); `uPlot` is the global
// the library element defines.
const charts = new WeakMap();
const DASHES = {dash: [6, 4], dot: [2, 3], dashdot: [6, 3, 2, 3], longdash: [10, 4]};

// live_chart.encode's layout: uint32 header length, a JSON header, padding to 8 bytes, the steps
// (float64), each line's values (float32 or float64, NaN: no point, which uPlot takes as null).
// Plain loops: Array.from with a mapping function costs several times more per value.
function decode(bytes) {
  const buf = bytes.slice().buffer;  // (a Uint8Array: unpack's part) a copy of its own, at offset 0: aligned views
  const size = new DataView(buf).getUint32(0, true);
  const data = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, size)));
  const n = data.n;
  let at = 4 + size + ((8 - ((4 + size) % 8)) % 8);
  const steps = new Float64Array(buf, at, n);
  data.x = new Array(n);
  for (let i = 0; i < n; i++) data.x[i] = steps[i];
  at += 8 * n;
  const Values = data.dtype === "f8" ? Float64Array : Float32Array;
  data.y = [];
  for (let j = 0; j < data.lines; j++, at += Values.BYTES_PER_ELEMENT * n) {
    const values = new Values(buf, at, n), line = new Array(n);
    for (let i = 0; i < n; i++) line[i] = Number.isNaN(values[i]) ? null : values[i];
    data.y.push(line);
  }
  return data;
}

// An update holds the rows after the first `keep` of the data carrying token `base` (a new step
// appends rows; see live_chart.update). On top of what the chart holds, when it holds that data:
// else null (a reloaded page, an update replaced before it was sent), and the chart asks for all.
function withHeld(held, data) {
  if (!data.keep) return data;
  if (!held || held.token !== data.base || held.x.length < data.keep) return null;
  const join = (kept, rows) => {
    kept.length = data.keep;
    for (const v of rows) kept.push(v);
    return kept;
  };
  data.x = join(held.x, data.x);
  data.y = data.y.map((rows, j) => join(held.y[j], rows));
  return data;
}

function columns(data) {
  return [data.x, ...data.y];
}

function seriesOptions(data) {
  return [{label: "step", value: (u, v) => (v == null ? "–" : String(Math.round(v)))},
    ...data.series.map(s => ({
      label: s.label, stroke: s.stroke, width: s.width, alpha: s.alpha, fill: s.fill || undefined,
      dash: DASHES[s.dash], spanGaps: true, points: {show: s.points, size: 5},
      paths: s.step ? uPlot.paths.stepped({align: 1}) : undefined,
      value: (u, v) => (v == null ? "–" : Number(v).toPrecision(3)),
    }))];
}

// Threshold lines (across the plot at a y) and change markers (dotted, at a step, labelled on top).
function drawLines(u, data) {
  const ctx = u.ctx, {left, top, width, height} = u.bbox, px = devicePixelRatio || 1;
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, width, height);
  ctx.clip();
  ctx.font = `${10 * px}px sans-serif`;
  for (const h of data.hlines) {
    const y = u.valToPos(h.y, "y", true);
    ctx.strokeStyle = ctx.fillStyle = h.colour;
    ctx.lineWidth = px;
    ctx.setLineDash((DASHES[h.dash] || []).map(d => d * px));
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke();
    ctx.textAlign = "right";
    ctx.fillText(h.text, left + width - 4 * px, y - 3 * px);
  }
  for (const v of data.vlines) {
    const x = u.valToPos(v.x, "x", true);
    if (x < left || x > left + width) continue;
    ctx.strokeStyle = ctx.fillStyle = v.colour;
    ctx.lineWidth = 1.2 * px;
    ctx.setLineDash(DASHES.dot.map(d => d * px));
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
    ctx.textAlign = "left";
    ctx.fillText(v.label, x + 2 * px, top + 10 * px);
  }
  ctx.restore();
}

// Hovering near a change marker names the change under the chart (what a marker's label means).
function noteChange(u, data, note) {
  const x = u.cursor.left;
  let near = null;
  for (const v of data.vlines) {
    if (x != null && x >= 0 && Math.abs(u.valToPos(v.x, "x") - x) <= 6) near = v;
  }
  note.textContent = near ? near.hover : "";
}

// A raw line is drawn and hidden with its smoothed line (plotly's legendgroup): one legend entry.
function followGroup(u, i, data) {
  const group = data.series[i - 1] && data.series[i - 1].group;
  if (!group) return;
  data.series.forEach((s, j) => {
    if (j + 1 !== i && s.group === group && u.series[j + 1].show !== u.series[i].show) {
      u.setSeries(j + 1, {show: u.series[i].show}, false);
    }
  });
}

function build(host, data) {
  const note = host.querySelector(".change-note");
  const now = u => u.spec || data;  // the hooks run once before the constructor returns
  const opts = {
    title: data.title, width: Math.max(200, host.clientWidth), height: data.height,
    // The y range is read at every draw: a chart's top follows its data (charts._top) without a rebuild.
    scales: {x: {time: false}, y: {range: (u, min, max) => now(u).y_range || uPlot.rangeNum(min, max, 0.1, true)}},
    axes: [{label: "step"}, {label: data.y_title}],
    series: seriesOptions(data),
    legend: {live: true},
    hooks: {
      draw: [u => drawLines(u, now(u))],
      setSelect: [u => { if (u.select.width > 0) u.zoomed = true; }],
      setCursor: [u => noteChange(u, now(u), note)],
      setSeries: [(u, i) => { if (i != null) followGroup(u, i, now(u)); }],
    },
  };
  const chart = new uPlot(opts, columns(data), host.querySelector(".plot"));
  chart.spec = data;
  data.series.forEach((s, j) => {  // raw lines: no legend entry of their own
    if (!s.legend) chart.root.querySelectorAll(".u-legend .u-series")[j + 1].style.display = "none";
  });
  host.ondblclick = () => { chart.zoomed = false; };  // uPlot's own double-click resets the scales
  chart.resized = new ResizeObserver(() => chart.setSize({width: Math.max(200, host.clientWidth), height: data.height}));
  chart.resized.observe(host);
  return chart;
}

// Same series, same titles: the data, the y range, the thresholds and markers may change in
// place. A new series or title rebuilds the chart.
function sameShape(a, b) {
  return JSON.stringify([a.series, a.title, a.y_title]) === JSON.stringify([b.series, b.title, b.y_title]);
}

// live_chart.pack's layout: uint32 directory length, a JSON directory (each chart's key, token and
// byte size: 0 when the element holds that token already), then the sent charts' bytes in order.
function unpack(bytes) {
  const view = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const size = new DataView(view.buffer, view.byteOffset, 4).getUint32(0, true);
  let at = 4 + size;
  return JSON.parse(new TextDecoder().decode(view.subarray(4, at))).map(entry => {
    const part = entry.size ? view.subarray(at, at + entry.size) : null;
    at += entry.size;
    return {...entry, part};
  });
}

// The element's charts, one host each (.live-chart) in a grid of two columns, in the directory's
// order; a chart no longer sent is removed.
function place(component, entries) {
  const {parentElement} = component;
  let grid = parentElement.querySelector(".live-charts");
  if (!grid) {
    grid = document.createElement("div");
    grid.className = "live-charts";
    grid.hosts = new Map();
    parentElement.appendChild(grid);
  }
  const keys = new Set(entries.map(e => e.key));
  for (const [key, host] of grid.hosts) {
    if (keys.has(key)) continue;
    const chart = charts.get(host);
    if (chart) { chart.resized.disconnect(); chart.destroy(); }
    host.remove();
    grid.hosts.delete(key);
  }
  entries.forEach((entry, i) => {
    let host = grid.hosts.get(entry.key);
    if (!host) {
      host = document.createElement("div");
      host.className = "live-chart";
      host.dataset.key = entry.key;
      host.innerHTML = '<div class="plot"></div><div class="change-note"></div>';
      grid.hosts.set(entry.key, host);
    }
    if (grid.children[i] !== host) grid.insertBefore(host, grid.children[i] || null);
    entry.host = host;
  });
}

// Whether an entry's chart holds the version the entry names already (drawn: nothing to do).
function holds(entry) {
  const chart = charts.get(entry.host);
  return Boolean(chart) && chart.spec.token === entry.token;
}

// One chart's entry: draw its bytes on top of what the chart holds, or name it among the charts to
// resend whole.
function render(entry, resend) {
  const {host} = entry;
  let chart = charts.get(host);
  if (holds(entry)) return;  // drawn already
  if (!entry.part) {  // sent nothing: the server thinks the element holds a version it does not
    resend.push(entry.key);
    return;
  }
  const data = withHeld(chart && chart.spec, decode(entry.part));
  if (!data) {  // made for data this chart does not hold: ask for the whole chart, keep drawing the old one
    resend.push(entry.key);
    return;
  }
  if (chart && sameShape(chart.spec, data)) {
    chart.spec = data;  // the draw hook reads the markers and thresholds of this refresh
    chart.setData(columns(data), !chart.zoomed);  // a zoomed chart keeps its zoom
  } else {
    if (chart) { chart.resized.disconnect(); chart.destroy(); }
    chart = build(host, data);
    charts.set(host, chart);
  }
  host.chart = chart;  // for tests and benches: the chart's scales, series and data
}

// The first chart that changed is drawn at once, the others just after the frame that shows it:
// drawing them all in one task kept the first from the screen until the last was drawn. Draws left
// from one message are done before the next message's, so each chart's draws keep their order. A
// page nobody sees gets no frame: there they are drawn at once after this task.
let later = null;  // {component, entries, resend}: the draws after the frame

function drawOne(entry, resend) {
  try {
    render(entry, resend);
  } catch (error) {  // a chart that fails to draw does not stop the others
    console.error(error);
  }
}

function drawAll(job) {
  for (const entry of job.entries) drawOne(entry, job.resend);
  if (job.resend.length) job.component.setTriggerValue("resend", job.resend);
}

function drawLater() {
  const job = later;
  later = null;
  if (job) drawAll(job);
}

globalThis.grpoHealthLiveChart = component => {
  drawLater();
  const entries = unpack(component.data);
  place(component, entries);
  const due = entries.filter(e => !holds(e));
  const resend = [];
  if (due.length) drawOne(due[0], resend);
  later = {component, entries: due.slice(1), resend};
  if (later.entries.length === 0) drawLater();
  else if (document.visibilityState === "hidden") setTimeout(drawLater, 0);
  else requestAnimationFrame(() => setTimeout(drawLater, 0));
};
