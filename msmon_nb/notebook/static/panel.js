// msmon_nb live panel: the browser side of msmon_nb.notebook.widget.PanelWidget.
//
// The kernel never draws. At step boundaries it sends, as one custom comm message, only
// what is new since its last message: per series key a few (min/max-decimated) points,
// packed in one binary float64 buffer, the status line's numbers, and the alerts
// and snapshot table when they changed. This module keeps the points per key, bounded by
// its own min/max decimation (so a one-step spike always survives), and draws them with
// the chart component msmon view draws with too (msmon_nb/static/chart.js, prepended to
// this file with uPlot by the kernel, see widget.py); a chart of kind "heatmap" (the
// activations: module x step) with msmon_nb/static/heatmap.js, prepended the same way. Smoothing, log/linear, hover, box
// zoom and double-click reset happen there with no kernel round trip.
//
// Protocol (kernel -> page): {type: "reset" | "append", status, charts?, keys: [key],
//   counts: [n], nonfinite: {key: [[step, "nan" | "inf" | "-inf"]]}, alerts?,
//   interventions?: [{step, time, who, what, arg, label, ok, message, rank}] (drawn as
//   marks on every chart), snapshots?: [{step, name, label, reason, shape, dtype, stats, histogram}], seq} with one buffer of float64: n steps then n values, key after
//   key; synced state `initial` (+ `initial_data`): a whole reset holding updates up to
//   its `seq` (kept current while no hello came through, see render()).
// Page -> kernel: {type: "hello"} on render (asks for a reset; it is also the
//   acknowledgement that our code loaded), and a control: {type: NAME, id} or, for a
//   command with an argument, {type: NAME, value, id}. The controls are built from the
//   synced trait `commands` ([{name, label, help, arg: {name, kind, min, example, start} | null,
//   when, button}]: a `button` command's field is sent by its "apply" button),
//   the kernel's command table): this file knows no command by name. The kernel answers
//   each control with {type: "ack", id, ok, message, status} at its next step boundary
//   (the status line then shows the monitor's state: paused, stopping...). A click waits
//   for the step in progress to end, however long that step is (a first graph compile can
//   take a minute), so the panel waits as long as the step is taking: a click unanswered
//   for longer than ACK_FLOOR_MS plus the larger of the time since the kernel's last
//   message (the step in progress) and the recent step time (1/rate) shows the
//   `msmon ctl` line that does the same from a terminal, and the viewer. That happens
//   when a front end does not pass the message to the busy kernel.
//
// Test contract: every chart element carries data-msmon-tag and data-last-step; the
// status line contains "step N"; the buttons read Pause/Resume and Stop.

// a click unanswered this long past the step in progress shows the terminal command: the
// kernel reads clicks every 0.1 s at step boundaries and answers at once (round trip)
const ACK_FLOOR_MS = 1500;
const STATE_COLOR = { running: "#2e7d32", paused: "#e65100", finished: "#555",
  following: "#1565c0" };

function shellQuote(text) {
  // a path as a POSIX shell word: bare when it is plain, else in single quotes
  return /^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replace(/'/g, "'\\''")}'`;
}

function f64(view) {
  // buffers arrive as DataViews at any byte offset; Float64Array needs 8-byte alignment
  const bytes = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
  return new Float64Array(bytes);
}

function fmtSecs(s) {
  s = Math.max(0, Math.floor(s));
  const p = (n) => String(n).padStart(2, "0");
  return `${Math.floor(s / 3600)}:${p(Math.floor(s / 60) % 60)}:${p(s % 60)}`;
}

function baseTag(key) { return key.split("@")[0]; }

// The series of one planned chart ({title, tags, labels, note, log, group}, the shape of
// msmon view's api/charts; here `tags` are series keys) from the panel's points: a
// distributed run's @min/@max keys are the band's edges; a line is named by the plan's
// label (an optimizer's series by the optimizer: `netd`, `netg`).
function seriesOf(panel, spec) {
  const out = [];
  spec.tags.forEach((key, i) => {
    const d = panel.data.get(key);
    if (!d) return;
    const band = key.endsWith("@min") ? "lo" : key.endsWith("@max") ? "hi" : null;
    const label = (spec.labels || spec.tags)[i];
    out.push({ label: spec.tags.length > 1 ? label : baseTag(label), tag: baseTag(key),
      color: band ? null : MSMON_COLORS[i % MSMON_COLORS.length], xs: d.xs, ys: d.ys, band,
      nonfinite: panel.nonfinite.get(key) || [] });
  });
  return out;
}

// The series key a heatmap cell's tag is drawn from: the tag itself, or in a distributed
// run (keys tag@rank<k>, tag@min/@max) the ranks' maximum, else the first rank's.
function heatKey(chart, tag) {
  if (!chart.keyOf) {
    chart.keyOf = new Map();
    for (const key of chart.spec.tags) {
      const base = baseTag(key);
      const held = chart.keyOf.get(base);
      const rank = (k) => (k === base ? 0 : k.endsWith("@max") ? 1 : 2);
      if (held === undefined || rank(key) < rank(held)) chart.keyOf.set(base, key);
    }
  }
  return chart.keyOf.get(tag) || tag;
}

// The rows of a heatmap for its selected statistic, from the panel's points: per module
// its series, its NaN/Inf marks, and the steps its nonfinite count was above 0.
function heatRowsOf(panel, chart) {
  return (chart.spec.rows || []).map((row) => {
    const key = heatKey(chart, chart.tagOf(row));
    const d = panel.data.get(key) || { xs: [], ys: [] };
    const count = chart.stat === MSMON_HEAT_COUNT ? null
      : panel.data.get(heatKey(chart, chart.tagOf(row, MSMON_HEAT_COUNT)));
    const flagged = [];
    if (count) count.ys.forEach((v, j) => { if (v > 0) flagged.push(count.xs[j]); });
    return { row, xs: d.xs, ys: d.ys, nonfinite: panel.nonfinite.get(key) || [], flagged };
  });
}

class Panel {
  constructor(model, el) {
    this.model = model;
    this.data = new Map(); // key -> {xs: [], ys: []}
    this.nonfinite = new Map(); // key -> [[step, kind]]
    this.alerts = [];
    this.interventions = []; // the kernel's records of commands and alert actions
    this.charts = [];
    this.chartSpecs = [];
    this.smooth = 0;
    this.scale = "auto";
    this.status = null;
    this.statusAt = 0;
    this.pending = new Map(); // control id -> {at, words, button, late} until its ack
    this.pendingTimer = null; // checks the pending clicks while there are any
    this.lastMsgAt = performance.now(); // the kernel's last message: at a step boundary
    this.buttons = []; // [{spec, el}] of the commands without an argument
    this.inputs = []; // [{spec, el}] of the commands with one
    this.nextId = 1;
    this.build(el);
  }

  build(el) {
    const model = this.model;
    this.titleEl = h("b", { text: model.get("title") || "msmon" });
    this.statusEl = h("span", { class: "msmon-status", text: "waiting for the first step" });
    this.resultEl = h("span", { class: "msmon-result" });
    this.smoothIn = h("input", { type: "range", min: "0", max: "0.99", step: "0.01",
      value: "0", class: "msmon-smooth" });
    this.smoothOut = h("span", { class: "msmon-muted", text: "0.00" });
    this.scaleSel = h("select", { class: "msmon-scale" },
      ...["auto", "log", "linear"].map((v) => h("option", { value: v, text: v })));
    const live = model.get("live");
    const controls = h("div", { class: "msmon-controls" });
    if (live) {
      for (const spec of model.get("commands") || []) controls.append(this.controlFor(spec));
      controls.append(this.resultEl);
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

  rowWidth() { return (this.grid.clientWidth || 900) - 8; }

  setCharts(specs) {
    const sig = JSON.stringify(specs);
    if (sig === JSON.stringify(this.chartSpecs)) return;
    this.chartSpecs = specs;
    for (const c of this.charts) c.destroy();
    this.grid.replaceChildren();
    this.charts = specs.map((s) => (s.kind === "heatmap"
      ? new MsmonHeatmap(s, () => this.draw(this.charts[specs.indexOf(s)], this.chartWidth()))
      : new MsmonChart({ title: s.title, tags: s.tags.map(baseTag), log: s.log, note: s.note })));
    this.charts.forEach((c, i) => { c.keys = specs[i].tags; c.labels = specs[i].labels; });
    for (const c of this.charts) this.grid.append(c.el);
  }

  // The control of one command of the kernel's table: a button, or for a command with an
  // argument a number field sent on change (the kernel checks it and says why it refuses).
  // A button with `when` shows only in that state (Pause while running, Resume while paused).
  controlFor(spec) {
    if (spec.arg) {
      // a `button` command acts anew at each send (lr ×F): its field waits for the click
      // where the field starts: the table's start, as in msmon view (then the status's value)
      const input = h("input", { type: "number", min: String(spec.arg.min),
        step: spec.arg.kind === "int" ? "1" : "any", value: String(spec.arg.start),
        class: `msmon-${spec.name}`, "data-cmd": spec.name, title: spec.help });
      const value = () => (input.value === "" ? null : Number(input.value));
      this.inputs.push({ spec, el: input });
      if (!spec.button) {
        input.addEventListener("change", () => this.control(spec, value(), null, input));
        return h("label", {}, `${spec.label} `, input);
      }
      const send = h("button", { class: `msmon-btn msmon-${spec.name}-send`, type: "button",
        text: "apply", "data-cmd": spec.name, title: spec.help });
      send.addEventListener("click", () => {
        send.disabled = true; // until the kernel answers
        this.control(spec, value(), send);
      });
      this.buttons.push({ spec, el: send });
      return h("label", {}, `${spec.label} `, input, send);
    }
    const button = h("button", { class: `msmon-btn msmon-${spec.name}`, type: "button",
      text: spec.label, "data-cmd": spec.name, title: spec.help });
    if (spec.when && spec.when !== "running") button.hidden = true;
    button.addEventListener("click", () => {
      button.disabled = true; // until the kernel answers
      this.control(spec, null, button);
    });
    this.buttons.push({ spec, el: button });
    return button;
  }

  // A control: sent as a comm message. The kernel answers when the step in progress ends;
  // unanswered well past that (overdue), the panel says how to do the same elsewhere.
  control(spec, value, button = null, input = null) {
    const id = this.nextId++;
    this.model.send(spec.arg ? { type: spec.name, value, id } : { type: spec.name, id });
    const words = spec.arg ? `${spec.name} ${value}` : spec.name;
    this.pending.set(id, { at: performance.now(), words, button, input, spec, late: false });
    if (this.pendingTimer === null) {
      this.pendingTimer = setInterval(() => this.checkPending(), 250);
    }
  }

  // How long the step in progress is taking, as far as the page can tell: the time since
  // the kernel's last message (it sends only at step boundaries, at least every refresh
  // while steps end), or the recent step time from the rate, whichever is larger (ms).
  stepMs(now) {
    const since = now - this.lastMsgAt;
    const s = this.status;
    const recent = s && s.state === "running" && s.rate > 0 ? 1000 / s.rate : 0;
    return Math.max(since, recent);
  }

  checkPending() {
    const now = performance.now();
    for (const p of this.pending.values()) {
      if (p.late || now - p.at <= ACK_FLOOR_MS + this.stepMs(now)) continue;
      p.late = true;
      if (p.button) p.button.disabled = false; // it may be clicked again, or done elsewhere
      this.unanswered(p.words, now - p.at);
    }
  }

  answered(id) {
    const pending = this.pending.get(id);
    this.pending.delete(id);
    if (pending && pending.button) pending.button.disabled = false;
    if (!this.pending.size) {
      this.hintEl.hidden = true;
      clearInterval(this.pendingTimer);
      this.pendingTimer = null;
    }
    return pending;
  }

  // A refused value must not stay in its field as if it were in force (freq 0 beside the
  // status line's "every 1 steps"): the field goes back to the value the kernel has, even
  // while the user's cursor is still in it, and is marked refused until the next answer.
  settleField(pending, msg) {
    const { input, spec } = pending || {};
    if (!input) return;
    const refused = msg.ok === false;
    input.classList.toggle("msmon-refused", refused);
    if (!refused) return;
    const held = msg.status && msg.status[spec.name];
    input.value = String(held != null ? held : spec.arg.start);
  }

  // The monitor's state, as the kernel sent it, on the controls: which of a pair shows,
  // and nothing to click once the run is stopping or over.
  applyStatus(s) {
    const off = !s.live || s.state === "stopping";
    const shown = s.paused ? "paused" : "running";
    for (const { spec, el } of this.buttons) {
      if (spec.when) el.hidden = spec.when !== shown;
      if (off) el.disabled = true;
      else if (![...this.pending.values()].some((p) => p.button === el)) el.disabled = false;
    }
    for (const { spec, el } of this.inputs) {
      // an argument the status carries under the command's name (the current value)
      if (s[spec.name] != null && document.activeElement !== el) el.value = String(s[spec.name]);
      if (off) el.disabled = true;
    }
  }

  // What is known when a click is overdue: the kernel acts on clicks when a step ends,
  // steps have ended since (or this one runs far longer than the recent ones), and still
  // no answer: this front end may not pass widget messages to a busy kernel.
  unanswered(words, waitedMs) {
    const runDir = this.model.get("run_dir");
    if (!runDir) return;
    const cmd = `msmon ctl ${shellQuote(runDir)} ${words}`;
    this.hintEl.replaceChildren(
      `No answer to ${words} after ${(waitedMs / 1000).toFixed(1)} s: the kernel acts on a ` +
        "click when the step in progress ends, and the click stays queued until then. " +
        "If this front end does not pass it on to a busy kernel, in a terminal: ",
      h("code", { class: "msmon-ctl", text: cmd }),
      " (or the same button in msmon view)");
    this.hintEl.hidden = false;
  }

  onMessage(msg, buffers) {
    this.lastMsgAt = performance.now();
    if (msg.type === "ack") {
      this.settleField(this.answered(msg.id), msg);
      if (msg.message != null) {
        this.resultEl.textContent = msg.message;
        this.resultEl.classList.toggle("msmon-refused", msg.ok === false);
      }
      if (msg.status) {
        this.status = msg.status;
        this.statusAt = performance.now();
        this.applyStatus(msg.status);
        this.renderStatus();
      }
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
      if (d.xs.length > MSMON_CAP) [d.xs, d.ys] = halve(d.xs, d.ys);
      touched.add(key);
    });
    for (const [key, marks] of Object.entries(msg.nonfinite || {})) {
      const list = this.nonfinite.get(key) || [];
      list.push(...marks);
      this.nonfinite.set(key, list);
      touched.add(key);
    }
    if (msg.alerts) { this.alerts = msg.alerts; this.renderAlerts(); }
    if (msg.interventions) this.interventions = msg.interventions;
    if (msg.snapshots) this.renderSnapshots(msg.snapshots);
    if (msg.status) {
      this.status = msg.status;
      this.statusAt = performance.now();
      this.applyStatus(msg.status);
    }
    const width = this.chartWidth();
    for (const c of this.charts) {
      if (msg.type === "reset" || msg.alerts || msg.interventions
        || c.keys.some((k) => touched.has(k))) {
        this.draw(c, width);
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
    const state = s.state;
    let elapsed = s.elapsed;
    if (s.live && s.state === "running") elapsed += (performance.now() - this.statusAt) / 1000;
    const parts = [`step ${s.step == null ? "-" : s.step}`];
    if (s.elapsed != null) parts.push(fmtSecs(elapsed));
    if (s.mean_rate != null) {
      parts.push(`${s.mean_rate.toFixed(1)} steps/s over the run`);
      if (s.rate != null) parts.push(`${s.rate.toFixed(1)} in its last second`);
    } else if (s.rate != null) parts.push(`${s.rate.toFixed(1)} steps/s`);
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
      items.push(h("li", { style: `color:${MSMON_SEVERITY.critical}` },
        h("b", { text: "NaN/Inf" }), " in ", h("code", { text: key }), ` since step ${step}`));
    }
    for (const a of this.alerts) {
      items.push(h("li", { style: `color:${MSMON_SEVERITY[a.severity] || "#333"}` },
        h("b", { text: a.kind }), ` since step ${a.since_step ?? a.step}: ${a.message || ""}`));
    }
    this.alertsEl.replaceChildren(items.length ? h("ul", {}, ...items)
      : h("span", { class: "msmon-ok", text: "no alerts" }));
  }

  // the newest snapshots, one row each with its histogram (the viewer's table's cells);
  // a snapshot's activation statistics (one row per module) in a table of their own
  renderSnapshots(all) {
    const acts = all.filter((e) => e.kind === "activations");
    const list = all.filter((e) => e.kind !== "activations");
    const parts = [];
    if (acts.length) {
      const steps = [...new Set(acts.map((e) => e.step))];
      const details = h("details", { class: "msmon-act-snapshots" }, h("summary", {},
        h("b", { text: "activations in snapshots" }),
        ` (${acts.length} modules at step${steps.length > 1 ? "s" : ""} ${steps.join(", ")})`),
      activationTable(acts));
      details.open = true;
      parts.push(details);
    }
    if (!list.length) { this.snapsEl.replaceChildren(...parts); return; }
    const head = h("tr", {}, ...["step", "tensor", "reason", "shape", "dtype", "min", "max",
      "mean", "std", "NaN/Inf", "histogram"].map((t) => h("th", { text: t })));
    const rows = list.map((e) => {
      const st = e.stats || {};
      const bad = (st.nan_count || 0) + (st.inf_count || 0);
      const row = h("tr", { "data-snapshot": String(e.name) },
        h("td", { text: String(e.step) }), h("td", {}, h("code", { text: String(e.label ?? e.name) })),
        h("td", { text: e.reason || "" }), h("td", { text: `(${(e.shape || []).join(", ")})` }),
        h("td", { text: e.dtype || "" }),
        ...["min", "max", "mean", "std"].map((k) => h("td", { text: fmtNum(st[k]) })),
        h("td", { text: `${st.nan_count || 0}/${st.inf_count || 0}` }),
        h("td", {}, histogramSVG(e.histogram, 120, 28)));
      if (bad) row.style.color = MSMON_SEVERITY.critical;
      return row;
    });
    const details = h("details", {}, h("summary", {}, h("b", { text: "snapshots" }),
      ` (${list.length} shown)`), h("table", { class: "msmon-snaps" }, head, ...rows));
    details.open = true;
    this.snapsEl.replaceChildren(details, ...parts);
  }

  draw(chart, width) {
    const alerts = this.alerts.map((a) => ({ step: a.since_step ?? a.step,
      severity: a.severity, tag: alertTag(a) }));
    if (chart.kind === "heatmap") {
      // a whole row of the grid (chart.css): its width, not a half
      chart.set(heatRowsOf(this, chart), { scale: this.scale, width: this.rowWidth(), alerts });
      return;
    }
    const marks = this.interventions.map(interventionMark).filter(Boolean);
    chart.set(seriesOf(this, { tags: chart.keys, labels: chart.labels }),
      { smooth: this.smooth, scale: this.scale, alerts, marks, width });
  }

  redrawAll() {
    const width = this.chartWidth();
    for (const c of this.charts) this.draw(c, width);
  }

  resizeAll() {
    const width = this.chartWidth();
    for (const c of this.charts) c.resize(c.kind === "heatmap" ? this.rowWidth() : width);
  }

  destroy() {
    clearInterval(this.ticker);
    clearInterval(this.pendingTimer);
    this.resizer.disconnect();
    for (const c of this.charts) c.destroy();
  }
}

function render({ model, el }) {
  const panel = new Panel(model, el);
  // Until the kernel answers this view's hello with a reset, the view follows the synced
  // state (in VS Code the hello waits for a step boundary, or the cell's end on ipykernel
  // < 7; the kernel then keeps the state current): each state is a whole reset, and an update it already holds (seq at most
  // the state's) is skipped, whichever of the two arrives first.
  let stateSeq = null;
  // one bad message is logged and the panel goes on with the next
  const draw = (msg, buffers) => {
    try {
      panel.onMessage(msg, buffers);
      return true;
    } catch (err) {
      console.error("msmon panel:", err);
      return false;
    }
  };
  const onMsg = (msg, buffers) => {
    if (msg.type === "reset") stateSeq = null;
    else if (stateSeq !== null && msg.seq !== undefined && msg.seq <= stateSeq) return;
    draw(msg, buffers);
  };
  const fromState = () => {
    const initial = model.get("initial");
    if (!initial || !initial.type) return;
    if (draw(initial, [model.get("initial_data")])) stateSeq = initial.seq ?? 0;
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
