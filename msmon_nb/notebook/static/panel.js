// msmon_nb live panel: the browser side of msmon_nb.notebook.widget.PanelWidget.
//
// The kernel never draws. At step boundaries it sends, as one custom comm message, only
// what is new since its last message: per series key a few (min/max-decimated) points,
// packed in one binary float64 buffer, the status line's numbers, and the alerts
// and snapshot table when they changed. This module keeps the points per key, bounded by
// its own min/max decimation (so a one-step spike always survives), and draws them with
// uPlot (prepended to this file by the kernel, see widget.py). Smoothing, log/linear,
// hover, box zoom and double-click reset happen here with no kernel round trip.
//
// Protocol (kernel -> page): {type: "reset" | "append", status, charts?, keys: [key],
//   counts: [n], nonfinite: {key: [[step, "nan" | "inf" | "-inf"]]}, alerts?,
//   snapshots_html?, seq} with one buffer of float64: n steps then n values, key after
//   key; synced state `initial` (+ `initial_data`): a whole reset holding updates up to
//   its `seq` (kept current while no hello came through, see render()).
// Page -> kernel: {type: "hello"} on render (asks for a reset; it is also the
//   acknowledgement that our code loaded), {type: "pause" | "resume" | "stop", id},
//   {type: "freq", value: N, id}. The kernel answers each control with {type: "ack", id}
//   at its next step boundary; without an answer within ACK_MS (VS Code does not deliver
//   widget messages to a busy kernel) the panel shows the `msmon ctl` line that does the
//   same from a terminal, and the viewer.
//
// Test contract: every chart element carries data-msmon-tag and data-last-step; the
// status line contains "step N"; the buttons read Pause/Resume and Stop.

const CAP = 4000; // points kept per key before the page decimates them to half
const ACK_MS = 2000; // a control click unanswered this long shows the terminal command
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22"];
const SEVERITY = { critical: "#b71c1c", warning: "#e65100", info: "#1565c0" };
const STATE_COLOR = { running: "#2e7d32", paused: "#e65100", finished: "#555",
  following: "#1565c0" };

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function shellQuote(text) {
  // a path as a POSIX shell word: bare when it is plain, else in single quotes
  return /^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replace(/'/g, "'\\''")}'`;
}

function f64(view) {
  // buffers arrive as DataViews at any byte offset; Float64Array needs 8-byte alignment
  const bytes = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
  return new Float64Array(bytes);
}

function fmtNum(v) {
  if (v == null || Number.isNaN(v)) return "-";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return String(Number(v.toPrecision(5)));
}

function fmtSecs(s) {
  s = Math.max(0, Math.floor(s));
  const p = (n) => String(n).padStart(2, "0");
  return `${Math.floor(s / 3600)}:${p(Math.floor(s / 60) % 60)}:${p(s % 60)}`;
}

// min/max decimation of one key's points to about half of CAP, keeping extremes
function halve(xs, ys) {
  const n = xs.length;
  const buckets = CAP / 4;
  const size = n / buckets;
  const ox = [];
  const oy = [];
  for (let b = 0; b < buckets; b++) {
    const lo = Math.floor(b * size);
    const hi = Math.min(n, Math.floor((b + 1) * size));
    if (hi <= lo) continue;
    let imin = -1;
    let imax = -1;
    for (let i = lo; i < hi; i++) {
      const v = ys[i];
      if (v == null || !Number.isFinite(v)) continue;
      if (imin < 0 || v < ys[imin]) imin = i;
      if (imax < 0 || v > ys[imax]) imax = i;
    }
    if (imin < 0) continue;
    for (const i of imin === imax ? [imin] : [Math.min(imin, imax), Math.max(imin, imax)]) {
      ox.push(xs[i]);
      oy.push(ys[i]);
    }
  }
  // the newest point stays exact: the status and data-last-step read it
  if (ox[ox.length - 1] !== xs[n - 1]) {
    ox.push(xs[n - 1]);
    oy.push(ys[n - 1]);
  }
  return [ox, oy];
}

// TensorBoard's debiased EMA; gaps stay gaps
function ema(ys, w) {
  const out = new Array(ys.length);
  let last = 0;
  let count = 0;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (v == null || !Number.isFinite(v)) { out[i] = null; continue; }
    last = last * w + (1 - w) * v;
    count += 1;
    out[i] = last / (1 - Math.pow(w, count));
  }
  return out;
}

function baseTag(key) { return key.split("@")[0]; }

function alertTag(a) {
  if (a.tag) return a.tag;
  const k = String(a.kind || "");
  if (k.startsWith("grad")) return "train/grad_norm";
  if (k.startsWith("lr")) return "train/learning_rate";
  if (k.startsWith("data")) return "train/data_time";
  return "train/loss";
}

class Chart {
  constructor(panel, spec) {
    this.panel = panel;
    this.spec = spec; // {title, keys, log}
    this.tags = [...new Set(spec.keys.map(baseTag))];
    this.el = h("div", { class: "msmon-chart", "data-msmon-tag": this.tags[0] || spec.title,
      "data-last-step": "-1" });
    // one element per further tag of a grouped chart, so each tag can be found
    this.extra = this.tags.slice(1).map((t) => h("span", { class: "msmon-tagmark",
      "data-msmon-tag": t, "data-last-step": "-1" }));
    this.title = h("div", { class: "msmon-chart-title", text: spec.title });
    this.box = h("div", { class: "msmon-chart-box" });
    this.empty = h("div", { class: "msmon-empty", text: "waiting for data" });
    this.el.append(this.title, this.box, this.empty, ...this.extra);
    this.plot = null;
    this.zoomed = false;
    this.builtFor = "";
  }

  log() {
    const scale = this.panel.scale;
    if (scale === "log") return true;
    if (scale === "linear") return false;
    return !!this.spec.log;
  }

  // the uPlot series list: one per key; a smoothed twin per key when smoothing is on
  layout() {
    const smooth = this.panel.smooth > 0;
    const series = [{ label: "step" }];
    const keys = this.spec.keys.filter((k) => this.panel.data.has(k));
    const bands = [];
    keys.forEach((key, i) => {
      const color = key.endsWith("@min") || key.endsWith("@max")
        ? "rgba(120,120,120,0.6)" : COLORS[i % COLORS.length];
      const label = this.spec.keys.length > 1 ? key : baseTag(key);
      series.push({ label, stroke: color, width: smooth ? 1 : 1.5, spanGaps: true,
        alpha: smooth ? 0.35 : 1, points: { show: false },
        value: (u, v) => fmtNum(v) });
      if (smooth) {
        series.push({ label: `${label} (smoothed)`, stroke: color, width: 2, spanGaps: true,
          points: { show: false }, value: (u, v) => fmtNum(v) });
      }
    });
    const per = smooth ? 2 : 1;
    const iMin = keys.findIndex((k) => k.endsWith("@min"));
    const iMax = keys.findIndex((k) => k.endsWith("@max"));
    if (iMin >= 0 && iMax >= 0) {
      bands.push({ series: [1 + iMax * per, 1 + iMin * per], fill: "rgba(120,120,120,0.15)" });
    }
    return { keys, series, bands };
  }

  build(width) {
    const { keys, series, bands } = this.layout();
    const sig = `${keys.join(",")}|${this.log()}|${this.panel.smooth > 0}`;
    if (this.plot && sig === this.builtFor) return;
    if (this.plot) this.plot.destroy();
    this.builtFor = sig;
    this.keys = keys;
    const log = this.log();
    const chart = this;
    const opts = {
      width: Math.max(200, width),
      height: 190,
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: true, uni: 30 }, points: { size: 5 } },
      scales: { x: { time: false }, y: log ? { distr: 3, log: 10 } : { distr: 1 } },
      axes: [
        { size: 28, font: "11px sans-serif" },
        { size: 56, font: "11px sans-serif", values: (u, vals) => vals.map((v) => (v == null ? "" : fmtNum(v))) },
      ],
      series,
      bands,
      hooks: {
        setSelect: [(u) => { if (u.select.width > 0) chart.setZoomed(true); }],
        draw: [(u) => chart.decorate(u)],
      },
    };
    this.plot = new uPlot(opts, this.data(), this.box);
    this.plot.over.addEventListener("dblclick", () => chart.setZoomed(false));
    this.el.dataset.scale = log ? "log" : "linear";
  }

  // while zoomed, new points do not reset the view; double-click returns to the whole run
  setZoomed(on) {
    this.zoomed = on;
    this.el.dataset.zoomed = on ? "1" : "0";
  }

  data() {
    const panel = this.panel;
    const log = this.log();
    const smooth = panel.smooth;
    const tables = [];
    for (const key of this.keys || []) {
      const d = panel.data.get(key);
      let ys = d.ys;
      if (log) ys = ys.map((v) => (v > 0 ? v : null));
      const cols = [d.xs, ys];
      if (smooth > 0) cols.push(ema(ys, smooth));
      tables.push(cols);
    }
    if (tables.length === 0) return [[]];
    if (tables.length === 1) return tables[0];
    return uPlot.join(tables);
  }

  lastStep() {
    let last = -1;
    for (const key of this.spec.keys) {
      const d = this.panel.data.get(key);
      if (d && d.xs.length) last = Math.max(last, d.xs[d.xs.length - 1]);
    }
    return last;
  }

  update(width) {
    const has = this.spec.keys.some((k) => this.panel.data.has(k));
    this.empty.style.display = has ? "none" : "";
    if (!has) return;
    this.build(width);
    this.plot.setData(this.data(), !this.zoomed);
    const last = String(this.lastStep());
    this.el.setAttribute("data-last-step", last);
    for (const mark of this.extra) {
      let l = -1;
      for (const key of this.spec.keys) {
        const d = this.panel.data.get(key);
        if (baseTag(key) === mark.dataset.msmonTag && d && d.xs.length) {
          l = Math.max(l, d.xs[d.xs.length - 1]);
        }
      }
      mark.setAttribute("data-last-step", String(l));
    }
  }

  resize(width) {
    if (this.plot) this.plot.setSize({ width: Math.max(200, width), height: 190 });
  }

  // NaN/Inf ticks on the top edge, alert onsets as dashed vertical lines
  decorate(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    const x = (step) => u.valToPos(step, "x", true);
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    for (const key of this.keys || []) {
      for (const [step] of this.panel.nonfinite.get(key) || []) {
        const px = x(step);
        ctx.fillStyle = "#d32f2f";
        ctx.fillRect(px - 1.5, top, 3, 9 * devicePixelRatio);
      }
    }
    ctx.setLineDash([4, 3]);
    ctx.lineWidth = 1.5;
    for (const a of this.panel.alerts) {
      if (!this.tags.includes(alertTag(a))) continue;
      const px = x(a.since_step ?? a.step);
      ctx.strokeStyle = SEVERITY[a.severity] || "#333";
      ctx.beginPath();
      ctx.moveTo(px, top);
      ctx.lineTo(px, top + height);
      ctx.stroke();
    }
    ctx.restore();
  }
}

class Panel {
  constructor(model, el) {
    this.model = model;
    this.data = new Map(); // key -> {xs: [], ys: []}
    this.nonfinite = new Map(); // key -> [[step, kind]]
    this.alerts = [];
    this.charts = [];
    this.chartSpecs = [];
    this.smooth = 0;
    this.scale = "auto";
    this.status = null;
    this.statusAt = 0;
    this.stopping = false;
    this.pending = new Map(); // control id -> timer until its ack
    this.nextId = 1;
    this.build(el);
  }

  build(el) {
    const model = this.model;
    this.titleEl = h("b", { text: model.get("title") || "msmon" });
    this.statusEl = h("span", { class: "msmon-status", text: "waiting for the first step" });
    this.pauseBtn = h("button", { class: "msmon-btn", type: "button", text: "Pause" });
    this.stopBtn = h("button", { class: "msmon-btn msmon-stop", type: "button", text: "Stop" });
    this.freqIn = h("input", { type: "number", min: "1", step: "1", value: "1",
      class: "msmon-freq", title: "collect every N steps (applies at the next step)" });
    this.smoothIn = h("input", { type: "range", min: "0", max: "0.99", step: "0.01",
      value: "0", class: "msmon-smooth" });
    this.smoothOut = h("span", { class: "msmon-muted", text: "0.00" });
    this.scaleSel = h("select", { class: "msmon-scale" },
      ...["auto", "log", "linear"].map((v) => h("option", { value: v, text: v })));
    const live = model.get("live");
    const controls = h("div", { class: "msmon-controls" });
    if (live) {
      controls.append(this.pauseBtn, this.stopBtn,
        h("label", {}, "collect every ", this.freqIn));
    }
    controls.append(h("label", {}, "smoothing ", this.smoothIn, this.smoothOut),
      h("label", {}, "y axis ", this.scaleSel));
    this.grid = h("div", { class: "msmon-grid" });
    this.alertsEl = h("div", { class: "msmon-alerts" });
    this.snapsEl = h("div", { class: "msmon-snapshots" });
    this.hintEl = h("div", { class: "msmon-hint", hidden: "" });
    const runDir = model.get("run_dir");
    const footer = h("div", { class: "msmon-footer" });
    if (runDir) footer.append("run dir: ", h("code", { text: runDir }));
    this.root = h("div", { class: "msmon-panel" },
      h("div", { class: "msmon-head" }, this.titleEl, this.statusEl),
      controls, this.hintEl, this.grid, this.alertsEl, this.snapsEl, footer);
    el.append(this.root);

    this.pauseBtn.addEventListener("click", () => {
      const pausing = this.pauseBtn.textContent === "Pause";
      this.pauseBtn.textContent = pausing ? "Resume" : "Pause";
      this.control({ type: pausing ? "pause" : "resume" });
    });
    this.stopBtn.addEventListener("click", () => {
      this.stopping = true;
      this.stopBtn.disabled = true;
      this.control({ type: "stop" });
      this.renderStatus();
    });
    this.freqIn.addEventListener("change", () => {
      const n = parseInt(this.freqIn.value, 10);
      if (n >= 1) this.control({ type: "freq", value: n });
    });
    this.smoothIn.addEventListener("input", () => {
      this.smooth = parseFloat(this.smoothIn.value);
      this.smoothOut.textContent = this.smooth.toFixed(2);
      this.redrawAll();
    });
    this.scaleSel.addEventListener("change", () => {
      this.scale = this.scaleSel.value;
      this.redrawAll();
    });
    this.resizer = new ResizeObserver(() => this.resizeAll());
    this.resizer.observe(this.grid);
    this.ticker = setInterval(() => this.renderStatus(), 500);
  }

  chartWidth() {
    const w = this.grid.clientWidth || 900;
    return w >= 760 ? Math.floor(w / 2) - 12 : w - 8;
  }

  setCharts(specs) {
    const sig = JSON.stringify(specs);
    if (sig === JSON.stringify(this.chartSpecs)) return;
    this.chartSpecs = specs;
    for (const c of this.charts) if (c.plot) c.plot.destroy();
    this.grid.replaceChildren();
    this.charts = specs.map((s) => new Chart(this, s));
    for (const c of this.charts) this.grid.append(c.el);
  }

  // A control click: sent as a comm message; unanswered after ACK_MS, the panel says how
  // to do the same where the page cannot reach a busy kernel.
  control(msg) {
    const id = this.nextId++;
    this.model.send({ ...msg, id });
    const words = msg.type === "freq" ? `freq ${msg.value}` : msg.type;
    this.pending.set(id, setTimeout(() => this.unanswered(words), ACK_MS));
  }

  unanswered(words) {
    const runDir = this.model.get("run_dir");
    if (!runDir) return;
    const cmd = `msmon ctl ${shellQuote(runDir)} ${words}`;
    this.hintEl.replaceChildren(
      "The kernel has not answered (VS Code holds widget messages while a cell runs). " +
        "In a terminal: ",
      h("code", { class: "msmon-ctl", text: cmd }),
      " (or the same button in msmon view)");
    this.hintEl.hidden = false;
  }

  onMessage(msg, buffers) {
    if (msg.type === "ack") {
      clearTimeout(this.pending.get(msg.id));
      this.pending.delete(msg.id);
      if (!this.pending.size) this.hintEl.hidden = true;
      return;
    }
    if (msg.type !== "reset" && msg.type !== "append") return;
    const began = performance.now();
    if (msg.type === "reset") {
      this.data.clear();
      this.nonfinite.clear();
    }
    if (msg.charts) this.setCharts(msg.charts);
    const touched = new Set();
    const packed = msg.keys && msg.keys.length ? f64(buffers[0]) : null;
    let offset = 0;
    (msg.keys || []).forEach((key, i) => {
      const n = msg.counts[i];
      const xs = packed.subarray(offset, offset + n);
      const ys = packed.subarray(offset + n, offset + 2 * n);
      offset += 2 * n;
      if (!n) return;
      let d = this.data.get(key);
      if (!d) { d = { xs: [], ys: [] }; this.data.set(key, d); }
      for (let j = 0; j < xs.length; j++) {
        d.xs.push(xs[j]);
        d.ys.push(Number.isFinite(ys[j]) ? ys[j] : null); // NaN/Inf: marked, not drawn
      }
      if (d.xs.length > CAP) [d.xs, d.ys] = halve(d.xs, d.ys);
      touched.add(key);
    });
    for (const [key, marks] of Object.entries(msg.nonfinite || {})) {
      const list = this.nonfinite.get(key) || [];
      list.push(...marks);
      this.nonfinite.set(key, list);
      touched.add(key);
    }
    if (msg.alerts) { this.alerts = msg.alerts; this.renderAlerts(); }
    if (msg.snapshots_html != null) this.snapsEl.innerHTML = msg.snapshots_html;
    if (msg.status) {
      this.status = msg.status;
      this.statusAt = performance.now();
      if (msg.status.freq && document.activeElement !== this.freqIn) {
        this.freqIn.value = String(msg.status.freq);
      }
      if (!this.stopping) this.pauseBtn.textContent = msg.status.paused ? "Resume" : "Pause";
      if (!msg.status.live) {
        for (const b of [this.pauseBtn, this.stopBtn, this.freqIn]) b.disabled = true;
      }
    }
    const width = this.chartWidth();
    for (const c of this.charts) {
      if (msg.type === "reset" || msg.alerts || c.spec.keys.some((k) => touched.has(k))) {
        c.update(width);
      }
    }
    this.renderStatus();
    // what one update cost the page, uPlot's redraws included (they run as microtasks
    // queued by setData, before this one); bench/panel.py reads it
    queueMicrotask(() => {
      this.root.dataset.updateMs = (performance.now() - began).toFixed(2);
      this.root.dataset.points = String([...this.data.values()]
        .reduce((n, d) => n + d.xs.length, 0));
    });
  }

  renderStatus() {
    const s = this.status;
    if (!s) return;
    let state = s.state;
    if (this.stopping && s.live) state = "stopping";
    let elapsed = s.elapsed;
    if (s.live && s.state === "running") elapsed += (performance.now() - this.statusAt) / 1000;
    const parts = [`step ${s.step == null ? "-" : s.step}`];
    if (s.elapsed != null) parts.push(fmtSecs(elapsed));
    if (s.rate != null) parts.push(`${s.rate.toFixed(1)} steps/s`);
    if (s.freq != null) parts.push(`every ${s.freq} steps`);
    if (s.note) parts.push(s.note);
    this.statusEl.replaceChildren(
      h("span", { class: "msmon-state", text: state,
        style: `color:${STATE_COLOR[state] || "#b71c1c"}` }),
      ` · ${parts.join(" · ")}`);
  }

  renderAlerts() {
    const items = [];
    const nf = [...this.nonfinite.entries()]
      .map(([k, m]) => [k, Math.min(...m.map((x) => x[0]))])
      .sort((a, b) => a[1] - b[1]);
    for (const [key, step] of nf) {
      items.push(h("li", { style: `color:${SEVERITY.critical}` },
        h("b", { text: "NaN/Inf" }), " in ", h("code", { text: key }), ` since step ${step}`));
    }
    for (const a of this.alerts) {
      items.push(h("li", { style: `color:${SEVERITY[a.severity] || "#333"}` },
        h("b", { text: a.kind }), ` since step ${a.since_step ?? a.step}: ${a.message || ""}`));
    }
    this.alertsEl.replaceChildren(items.length ? h("ul", {}, ...items)
      : h("span", { class: "msmon-ok", text: "no alerts" }));
  }

  redrawAll() {
    const width = this.chartWidth();
    for (const c of this.charts) c.update(width);
  }

  resizeAll() {
    const width = this.chartWidth();
    for (const c of this.charts) c.resize(width);
  }

  destroy() {
    clearInterval(this.ticker);
    for (const timer of this.pending.values()) clearTimeout(timer);
    this.resizer.disconnect();
    for (const c of this.charts) if (c.plot) c.plot.destroy();
  }
}

function render({ model, el }) {
  const panel = new Panel(model, el);
  // Until the kernel answers this view's hello with a reset, the view follows the synced
  // state (VS Code holds the hello while a cell runs; the kernel then keeps the state
  // current): each state is a whole reset, and an update it already holds (seq at most
  // the state's) is skipped, whichever of the two arrives first.
  let stateSeq = null;
  const onMsg = (msg, buffers) => {
    try {
      if (msg.type === "reset") stateSeq = null;
      else if (stateSeq !== null && msg.seq !== undefined && msg.seq <= stateSeq) return;
      panel.onMessage(msg, buffers);
    } catch (err) {
      console.error("msmon panel:", err);
    }
  };
  const fromState = () => {
    const initial = model.get("initial");
    if (!initial || !initial.type) return;
    try {
      panel.onMessage(initial, [model.get("initial_data")]);
      stateSeq = initial.seq ?? 0;
    } catch (err) {
      console.error("msmon panel:", err);
    }
  };
  const onState = () => {
    if (stateSeq !== null) fromState();
  };
  model.on("msg:custom", onMsg);
  model.on("change:initial", onState);
  // a finished or static panel carries its data in the widget state: drawn at once,
  // even while the kernel is busy elsewhere; the hello then asks for anything newer
  fromState();
  if (stateSeq === null) stateSeq = 0; // nothing yet: follow the state until a reset
  model.send({ type: "hello" });
  return () => {
    model.off("msg:custom", onMsg);
    model.off("change:initial", onState);
    panel.destroy();
  };
}

export default { render };
