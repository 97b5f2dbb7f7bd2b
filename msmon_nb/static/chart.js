// msmon_nb chart: the one chart component of the notebook panel and of `msmon view`.
//
// A classic script with top-level declarations and no imports, so that it works in both
// places without a build step: the viewer page loads it with a <script> tag after uPlot
// (MIT, uPlot.iife.min.js beside this file); the panel's anywidget module is uPlot, this
// file and panel.js joined into one ES module (notebook/widget.py). Everything a user
// sees on a chart is decided here: uPlot line drawing, debiased EMA smoothing, log or
// linear y, the hover legend, box zoom and double-click reset, NaN/Inf ticks on the top
// edge, alert onsets as dashed lines, the ranks' min..max as a band, number formatting,
// min/max point halving and the snapshot histogram.
//
// Test contract (both pages): each chart element carries data-msmon-tag (its first tag;
// further tags on hidden .msmon-tagmark children) and data-last-step (the last step drawn
// for that tag), data-scale (log | linear), data-zoomed, data-points, data-nonfinite and
// data-version; `element.msmonChart.drawn()` returns what is drawn (its `marks` are the
// interventions, each with `left`, where its line is); data-mark-step names the
// intervention whose text the hover tip (.msmon-mark-tip) shows.

const MSMON_CAP = 4000; // points a live series keeps before halving them (panel)
const MSMON_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f", "#d62728"];
// the severities a rule raises (config/cards.py Card.severity); the pages know no other
const MSMON_SEVERITY = { critical: "#b71c1c", warning: "#e65100" };
const MSMON_BAND = "rgba(120,120,120,0.6)";
const MSMON_INTERVENTION = "#6a1b9a"; // the marks of interventions (checkpoint, lr, pause...)

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

// one number for a legend, an axis or a table: 5 significant digits, exponent outside
// [1e-3, 1e5), "nan" / "inf" / "-inf" spelled out (the API sends them as strings)
function fmtNum(v) {
  if (v == null) return "-";
  if (typeof v === "string") return v;
  if (Number.isNaN(v)) return "nan";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return String(Number(v.toPrecision(5)));
}

// TensorBoard's debiased EMA; non-finite points stay gaps and do not advance it. The same
// definition as msmon_nb.metrics.decimate.ema (tests compare the two on the same data).
function ema(ys, w) {
  const out = new Array(ys.length);
  let last = 0;
  let count = 0;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (v == null || !Number.isFinite(v)) { out[i] = null; continue; }
    last = last * w + (1 - w) * v;
    count += 1;
    out[i] = w > 0 ? last / (1 - Math.pow(w, count)) : v;
  }
  return out;
}

// min/max decimation of a growing series to about half of `cap` points: each bucket keeps
// its extremes (a one-step spike survives), the first and the newest point stay exact
function halve(xs, ys, cap = MSMON_CAP) {
  const n = xs.length;
  const buckets = Math.max(1, Math.floor(cap / 4));
  const size = n / buckets;
  const ox = [xs[0]];
  const oy = [ys[0]];
  for (let b = 0; b < buckets; b++) {
    const lo = Math.max(1, Math.floor(b * size));
    const hi = Math.min(n - 1, Math.floor((b + 1) * size));
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
  if (n > 1) {
    ox.push(xs[n - 1]);
    oy.push(ys[n - 1]);
  }
  return [ox, oy];
}

// a snapshot's histogram ({edges, counts, min, max, count}) as a small SVG bar chart
function histogramSVG(hist, width = 160, height = 36) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "msmon-hist");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  if (!hist || !hist.counts || !hist.counts.length) return svg;
  const top = Math.max(...hist.counts, 1);
  const w = width / hist.counts.length;
  hist.counts.forEach((c, i) => {
    const bar = ((height - 2) * c) / top;
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", String(i * w));
    rect.setAttribute("y", String(height - bar));
    rect.setAttribute("width", String(Math.max(w - 0.5, 0.5)));
    rect.setAttribute("height", String(bar));
    const title = document.createElementNS(ns, "title");
    title.textContent = `${fmtNum(hist.edges[i])} .. ${fmtNum(hist.edges[i + 1])}: ${c}`;
    rect.append(title);
    svg.append(rect);
  });
  const label = document.createElementNS(ns, "title");
  label.textContent = `min ${fmtNum(hist.min)} max ${fmtNum(hist.max)} count ${hist.count}`;
  svg.prepend(label);
  return svg;
}

// The chart an alert belongs on: the `chart` the kernel (panel) or the viewer API stamps
// on every alert, from its tag or its kind's card (msmon_nb/config/cards.py), so no list
// of kinds lives here; null: every chart of the run.
function alertTag(a) {
  if (a.chart !== undefined) return a.chart;
  return a.tag || null;
}

// An intervention (a command or an alert action that changed training, from the run's
// interventions.jsonl) as a chart mark: {step, label, text}; the label names what was done
// (the record's own, e.g. `lr x0.5`), the text says who did it and what came of it (shown
// on hover). Refused ones changed nothing: null, not drawn.
function interventionMark(i) {
  if (!i || !i.ok || i.step == null) return null;
  const label = String(i.label || i.what || "?");
  const rank = i.rank == null ? "" : ` (rank ${i.rank})`;
  return { step: i.step, label, text: `step ${i.step}${rank}, ${i.who}: ${i.message || label}` };
}

// One chart. `spec`: {title, tags, log, note} (`note`: the title's hover text). `onZoom(range | null)`: called after a box zoom
// ([x0, x1]) or a double-click reset (null); without it the chart zooms in place and new
// points leave a zoomed view alone.
//
// set(series, view) draws: series = [{label, tag, color, xs, ys, nonfinite: [[step, kind]],
// band: "lo" | "hi" (the two edges of a shaded band, never smoothed), width, dash}];
// view = {smooth: 0..0.99, scale: "auto" | "log" | "linear", alerts: [{step, severity,
// label, tag}], marks: [{step, label, text}] (interventions: on every chart, their text
// shown when the cursor is on one), width, fit}. `fit` (default true unless zoomed)
// rescales the axes to the data.
class MsmonChart {
  constructor(spec, onZoom = null, height = 190) {
    this.spec = spec;
    this.tags = [...new Set(spec.tags)];
    this.onZoom = onZoom;
    this.height = height;
    this.el = h("div", { class: "msmon-chart", "data-msmon-tag": this.tags[0] || spec.title,
      "data-last-step": "-1", "data-version": "0" });
    this.el.msmonChart = this;
    this.marks = this.tags.slice(1).map((t) => h("span", { class: "msmon-tagmark",
      "data-msmon-tag": t, "data-last-step": "-1" }));
    this.titleEl = h("div", { class: "msmon-chart-title", text: spec.title });
    // why the chart looks as it does (e.g. no whole-step line beside the optimizers' own)
    if (spec.note) this.titleEl.title = spec.note;
    this.box = h("div", { class: "msmon-chart-box" });
    this.empty = h("div", { class: "msmon-empty", text: "waiting for data" });
    // the hovered intervention's text (data-mark-step says which)
    this.tip = h("div", { class: "msmon-mark-tip" });
    this.tip.hidden = true;
    this.el.append(this.titleEl, this.box, this.empty, this.tip, ...this.marks);
    this.plot = null;
    this.builtFor = "";
    this.zoomed = null; // [x0, x1] while box-zoomed
    this.series = [];
    this.view = { smooth: 0, scale: "auto", alerts: [], marks: [] };
    this.version = 0;
  }

  isLog() {
    const scale = this.view.scale;
    if (scale === "log") return true;
    if (scale === "linear") return false;
    return !!this.spec.log;
  }

  setTitleNote(note) {
    this.titleEl.textContent = note ? `${this.spec.title} · ${note}` : this.spec.title;
  }

  // uPlot's series list: one per given series, a smoothed twin per line when smoothing
  layout() {
    const smooth = this.view.smooth > 0;
    const out = [{ label: "step", value: (u, v) => (v == null ? "-" : String(v)) }];
    const roles = [];
    const lo = [];
    const hi = [];
    this.series.forEach((s, i) => {
      const color = s.color || (s.band ? MSMON_BAND : MSMON_COLORS[i % MSMON_COLORS.length]);
      const common = { stroke: color, spanGaps: true, points: { show: false },
        value: (u, v) => fmtNum(v), dash: s.dash };
      if (s.band) {
        (s.band === "lo" ? lo : hi).push(out.length);
        out.push({ ...common, label: s.label, width: 0.5 });
        roles.push([i, s.band]);
        return;
      }
      out.push({ ...common, label: s.label, width: smooth ? 1 : (s.width || 1.5),
        alpha: smooth ? 0.35 : 1 });
      roles.push([i, "line"]);
      if (smooth) {
        out.push({ ...common, label: `${s.label} (smoothed)`, width: 2 });
        roles.push([i, "smoothed"]);
      }
    });
    const bands = lo.map((l, k) => (k < hi.length
      ? { series: [hi[k], l], fill: "rgba(120,120,120,0.15)" } : null)).filter(Boolean);
    return { series: out, bands, roles };
  }

  columns() {
    const log = this.isLog();
    const tables = [];
    for (const [i, role] of this.roles) {
      const s = this.series[i];
      let ys = s.ys;
      if (log) ys = Array.from(ys, (v) => (v > 0 ? v : null));
      else ys = Array.from(ys, (v) => (v == null || Number.isFinite(v) ? v : null));
      if (role === "smoothed") tables.push([s.xs, ema(ys, this.view.smooth)]);
      else tables.push([s.xs, ys]);
    }
    if (!tables.length) return [[]];
    if (tables.length === 1) return tables[0];
    return uPlot.join(tables);
  }

  build(width) {
    const { series, bands, roles } = this.layout();
    const log = this.isLog();
    const sig = `${series.map((s) => s.label + s.stroke).join(",")}|${log}`;
    this.roles = roles;
    if (this.plot && sig === this.builtFor) return false;
    if (this.plot) this.plot.destroy();
    this.builtFor = sig;
    const chart = this;
    const opts = {
      width: Math.max(200, width),
      height: this.height,
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: !this.onZoom, uni: 30, setScale: !this.onZoom },
        points: { size: 5 } },
      scales: { x: { time: false }, y: log ? { distr: 3, log: 10 } : { distr: 1 } },
      axes: [
        { size: 28, font: "11px sans-serif" },
        { size: 56, font: "11px sans-serif",
          values: (u, vals) => vals.map((v) => (v == null ? "" : fmtNum(v))) },
      ],
      series,
      bands,
      hooks: {
        setSelect: [(u) => chart.selected(u)],
        draw: [(u) => chart.decorate(u)],
        setCursor: [(u) => chart.hover(u.cursor.left)],
      },
    };
    this.plot = new uPlot(opts, this.columns(), this.box);
    this.plot.over.addEventListener("dblclick", () => chart.unzoom());
    this.el.dataset.scale = log ? "log" : "linear";
    return true;
  }

  selected(u) {
    if (u.select.width <= 0) return;
    const x0 = u.posToVal(u.select.left, "x");
    const x1 = u.posToVal(u.select.left + u.select.width, "x");
    this.zoomed = [x0, x1];
    this.el.dataset.zoomed = "1";
    if (this.onZoom) {
      u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
      this.onZoom([x0, x1]);
    }
  }

  unzoom() {
    const was = this.zoomed;
    this.zoomed = null;
    this.el.dataset.zoomed = "0";
    if (this.onZoom && was) this.onZoom(null);
  }

  set(series, view = {}) {
    this.series = series;
    this.view = { ...this.view, ...view };
    const has = series.some((s) => s.xs.length);
    this.empty.style.display = has ? "none" : "";
    this.box.style.display = has ? "" : "none";
    if (has) {
      const width = this.view.width || this.el.clientWidth || 420;
      const fresh = this.build(width);
      const fit = this.view.fit ?? !this.zoomed;
      if (!fresh) this.plot.setData(this.columns(), fit);
    }
    this.version += 1;
    const last = (tag) => {
      let l = -1;
      for (const s of series) {
        if ((tag == null || s.tag === tag) && s.xs.length) l = Math.max(l, s.xs[s.xs.length - 1]);
      }
      return l;
    };
    this.el.dataset.lastStep = String(last(this.tags.length ? this.tags[0] : null));
    for (const mark of this.marks) mark.dataset.lastStep = String(last(mark.dataset.msmonTag));
    this.el.dataset.points = String(series.reduce((n, s) => n + s.xs.length, 0));
    this.el.dataset.nonfinite = String(series.reduce((n, s) => n + (s.nonfinite || []).length, 0));
    this.el.dataset.version = String(this.version);
  }

  resize(width) {
    if (this.plot) this.plot.setSize({ width: Math.max(200, width), height: this.height });
  }

  // NaN/Inf ticks on the top edge, alert onsets as dashed vertical lines (with a label)
  decorate(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    const x = (step) => u.valToPos(step, "x", true);
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    ctx.fillStyle = "#d32f2f";
    for (const s of this.series) {
      for (const [step] of s.nonfinite || []) ctx.fillRect(x(step) - 1.5, top, 3, 9 * devicePixelRatio);
    }
    ctx.setLineDash([4, 3]);
    ctx.lineWidth = 1.5;
    ctx.font = `${10 * devicePixelRatio}px sans-serif`;
    for (const a of this.alertsHere()) {
      const px = x(a.step);
      ctx.strokeStyle = MSMON_SEVERITY[a.severity] || "#333";
      ctx.beginPath();
      ctx.moveTo(px, top);
      ctx.lineTo(px, top + height);
      ctx.stroke();
      if (a.label) {
        ctx.fillStyle = ctx.strokeStyle;
        ctx.fillText(a.label, px + 3, top + 20 * devicePixelRatio);
      }
    }
    // interventions: a solid line with a triangle on the bottom edge and what was done
    ctx.setLineDash([]);
    ctx.strokeStyle = ctx.fillStyle = MSMON_INTERVENTION;
    for (const m of this.view.marks || []) {
      const px = x(m.step);
      const bottom = top + height;
      const t = 5 * devicePixelRatio;
      ctx.beginPath();
      ctx.moveTo(px, top);
      ctx.lineTo(px, bottom);
      ctx.stroke();
      ctx.beginPath();
      ctx.moveTo(px, bottom - t);
      ctx.lineTo(px - t, bottom);
      ctx.lineTo(px + t, bottom);
      ctx.fill();
      ctx.fillText(m.label, px + 3, bottom - 8 * devicePixelRatio);
    }
    ctx.restore();
  }

  // The intervention under the cursor (within 5 px of its line): its text in the tip.
  hover(left) {
    const u = this.plot;
    let best = null;
    if (u && left != null && left >= 0) {
      for (const m of this.view.marks || []) {
        const d = Math.abs(u.valToPos(m.step, "x") - left);
        if (d <= 5 && (!best || d < best.d)) best = { d, m };
      }
    }
    this.tip.hidden = !best;
    if (!best) { delete this.el.dataset.markStep; return; }
    this.tip.textContent = best.m.text;
    this.tip.style.left = `${Math.max(0, u.over.offsetLeft + left + 6)}px`;
    this.el.dataset.markStep = String(best.m.step);
  }

  alertsHere() {
    return (this.view.alerts || []).filter((a) => a.tag == null || this.tags.includes(a.tag));
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }

  // what is drawn, for tests: each line (smoothed lines marked), NaN/Inf marks, alert lines
  drawn() {
    const lines = [];
    for (const [i, role] of this.roles || []) {
      const s = this.series[i];
      const ys = Array.from(s.ys, (v) => (v == null || Number.isFinite(v) ? v : null));
      lines.push({ label: s.label, tag: s.tag, role,
        xs: Array.from(s.xs), ys: role === "smoothed" ? ema(ys, this.view.smooth) : ys });
    }
    return {
      lines,
      nonfinite: this.series.filter((s) => (s.nonfinite || []).length)
        .map((s) => ({ label: s.label, marks: s.nonfinite })),
      alerts: this.alertsHere().map((a) => ({ step: a.step, label: a.label || "",
        severity: a.severity })),
      // interventions, with where each line is (CSS px from the plot area's left edge)
      marks: (this.view.marks || []).map((m) => ({ step: m.step, label: m.label, text: m.text,
        left: this.plot ? this.plot.valToPos(m.step, "x") : null })),
      scale: this.isLog() ? "log" : "linear",
      xRange: this.plot ? [this.plot.scales.x.min, this.plot.scales.x.max] : null,
    };
  }
}
