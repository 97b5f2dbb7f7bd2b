// msmon_nb heatmap: the activations chart (module x step) of the notebook panel and of
// `msmon view`, beside chart.js and loaded after it (it uses its h and fmtNum).
//
// 20 modules x 5 statistics drawn as lines were 100 lines nobody could read; here a row per
// module (top to bottom in the plan's order: the forward order), a column per collected
// step, one statistic at a time (the selector; norm first), colour on a log scale wherever
// the statistic is positive (linear otherwise: a mean can be negative, a zero share 0).
// A run longer than the chart has pixels for is thinned like the line charts: each column
// stands for a range of steps and shows its value of largest magnitude, so a one-step
// blow-up survives. A cell whose value is NaN/Inf, or whose module's `nonfinite` count is
// above 0 at that step, is drawn red (no colour of the scale is red); a column the
// module has no value for stays pale grey.
//
// spec: the plan's {title, tags, group, rows, stats, note, kind: "heatmap"} (docs/PROTOCOL.md).
// onStat(stat): the selector changed; the host then calls set() with that statistic's rows
// (the viewer fetches them, the panel has them).
//
// set(rows, view): rows = [{row, xs, ys, nonfinite: [[step, kind]], flagged: [step]}] for
// the selected statistic (ys: numbers, null where not finite; `flagged`: steps whose
// nonfinite count is above 0); view = {scale: "auto" | "log" | "linear", width, alerts:
// [{step, severity, tag}]}. An alert whose tag is one of this heatmap's modules'
// (`<group>/<module>/<stat>`: the activation rules name the module) is drawn as a ring, in
// its severity's colour, round that module's cell at the column of its onset step; other
// alerts are the line charts'.
//
// Test contract: the element carries data-kind="heatmap", data-msmon-tag (its first tag),
// data-last-step, data-stat (the statistic drawn), data-rows, data-cols, data-bad (non-finite cells) and
// data-version; `element.msmonChart.drawn()` returns what is drawn, with each cell's
// place on the canvas (CSS px) so a test reads the pixel the user sees.

const MSMON_HEAT_MAX_COLS = 400; // columns at most, whatever the width
// the statistic that counts a module's non-finite values: a cell of any other statistic
// whose count is above 0 is marked (the pages name it through this, not by its spelling)
const MSMON_HEAT_COUNT = "nonfinite";
const MSMON_HEAT_BAD = "#d62728"; // non-finite cells
const MSMON_HEAT_EMPTY = "#eef0f2"; // no value recorded for that module in that column
// viridis at 0, 0.25, 0.5, 0.75, 1 (matplotlib's): ordered in lightness, and red-free
const MSMON_HEAT_STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98],
  [253, 231, 37]];

function heatRGB(t) {
  const x = Math.min(1, Math.max(0, t)) * (MSMON_HEAT_STOPS.length - 1);
  const i = Math.min(MSMON_HEAT_STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [MSMON_HEAT_STOPS[i], MSMON_HEAT_STOPS[i + 1]];
  return a.map((v, k) => Math.round(v + (b[k] - v) * f));
}

function heatColor(t) { return `rgb(${heatRGB(t).join(",")})`; }

// 256 colours of the scale, computed once: a cell is a table lookup, not a colour string
const MSMON_HEAT_LUT = Array.from({ length: 256 }, (_, i) => heatRGB(i / 255));

function rgbOf(css) { return [1, 3, 5].map((i) => parseInt(css.slice(i, i + 2), 16)); }

function sameSteps(a, b) {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

// The columns of `rows`: each distinct step while they fit in `max`, else `max` equal step
// ranges. Returns [{lo, hi}] (inclusive) and a step -> column function.
function heatColumns(rows, max) {
  const base = rows.reduce((a, r) => (r.xs.length > a.length ? r.xs : a), []);
  const shared = rows.every((r) => !r.xs.length || sameSteps(r.xs, base));
  if (base.length <= max && shared) {
    // every row holds the same steps (the usual case: each module is recorded at each
    // collected step): a point's index is its column, no set, sort or lookup per point;
    // a NaN mark or a flagged step is one of those steps (recorded as a point too)
    const index = new Map(Array.from(base, (x, i) => [x, i]));
    const at = (s) => index.get(s);
    const marks = rows.flatMap((r) => [...(r.flagged || []), ...(r.nonfinite || []).map((m) => m[0])]);
    if (marks.every((x) => at(x) !== undefined)) {
      return { cols: Array.from(base, (s) => ({ lo: s, hi: s })), at, same: true };
    }
  }
  // shared steps too many for the columns: binned by their range, which their ends
  // (and any mark) give, without a set of every step
  const full = !shared || base.length <= max;
  const seen = new Set(full ? [] : [base[0], base[base.length - 1]]);
  for (const r of rows) {
    if (full) for (const x of r.xs) seen.add(x);
    for (const [x] of r.nonfinite || []) seen.add(x);
    for (const x of r.flagged || []) seen.add(x);
  }
  const steps = [...seen].sort((a, b) => a - b);
  if (full && steps.length <= max) {
    const index = new Map(steps.map((s, i) => [s, i]));
    return { cols: steps.map((s) => ({ lo: s, hi: s })), at: (s) => index.get(s) };
  }
  const first = steps[0];
  const span = steps[steps.length - 1] - first + 1;
  const width = Math.ceil(span / max);
  const n = Math.ceil(span / width);
  const cols = [];
  for (let i = 0; i < n; i++) cols.push({ lo: first + i * width, hi: first + (i + 1) * width - 1 });
  return { cols, at: (s) => Math.floor((s - first) / width) };
}

class MsmonHeatmap {
  constructor(spec, onStat = null) {
    this.spec = spec;
    this.kind = "heatmap";
    this.tags = [...spec.tags];
    const stats = spec.stats || [];
    this.stat = stats.includes("norm") ? "norm" : stats[0];
    this.onStat = onStat;
    this.el = h("div", { class: "msmon-chart msmon-heatmap", "data-kind": "heatmap",
      "data-msmon-tag": spec.tags[0] || spec.title, "data-last-step": "-1",
      "data-stat": this.stat || "", "data-version": "0" });
    this.el.msmonChart = this;
    this.titleEl = h("span", { class: "msmon-chart-title", text: spec.title });
    if (spec.note) this.titleEl.title = spec.note;
    this.select = h("select", { class: "msmon-heat-stat", "aria-label": `${spec.title}: statistic` },
      ...stats.map((s) => h("option", { value: s, text: s })));
    this.select.value = this.stat;
    this.select.addEventListener("change", () => {
      this.stat = this.select.value; // data-stat follows once its rows are drawn
      if (this.onStat) this.onStat(this.stat);
    });
    this.canvas = h("canvas", { class: "msmon-heat-canvas" });
    this.empty = h("div", { class: "msmon-empty", text: "waiting for data" });
    this.tip = h("div", { class: "msmon-heat-tip" });
    this.tip.hidden = true;
    this.el.append(h("div", { class: "msmon-heat-head" }, this.titleEl, " ", this.select),
      this.canvas, this.empty, this.tip);
    this.canvas.addEventListener("mousemove", (ev) => this.hover(ev));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.rows = [];
    this.view = { scale: "auto" };
    this.grid = null;
    this.version = 0;
    this.note = "";
  }

  // the tag of one cell's series: <group>/<module>/<stat>
  tagOf(row, stat = this.stat) { return `${this.spec.group}/${row}/${stat}`; }

  // the tags a host supplies for the selected statistic: its own and the nonfinite count's
  wanted() {
    const out = [];
    for (const row of this.spec.rows || []) {
      out.push(this.tagOf(row));
      if (this.stat !== MSMON_HEAT_COUNT && (this.spec.stats || []).includes(MSMON_HEAT_COUNT)) {
        out.push(this.tagOf(row, MSMON_HEAT_COUNT));
      }
    }
    return out.filter((t) => this.tags.includes(t));
  }

  setTitleNote(note) {
    this.note = note;
    this.titleEl.textContent = note ? `${this.spec.title} · ${note}` : this.spec.title;
  }

  // the cells of the grid: per row, per column, the value of largest magnitude and
  // whether any step of it was non-finite
  layout(rows, maxCols) {
    const { cols, at, same } = heatColumns(rows, maxCols);
    const values = rows.map(() => new Array(cols.length).fill(null));
    const bad = rows.map(() => new Array(cols.length).fill(null));
    rows.forEach((r, i) => {
      for (let j = 0; j < r.xs.length; j++) {
        const v = r.ys[j];
        if (v == null || !Number.isFinite(v)) continue;
        const c = same ? j : at(r.xs[j]);
        const old = values[i][c];
        if (old == null || Math.abs(v) > Math.abs(old)) values[i][c] = v;
      }
      for (const [x, kind] of r.nonfinite || []) bad[i][at(x)] = String(kind);
      for (const x of r.flagged || []) {
        const c = at(x);
        if (bad[i][c] == null) bad[i][c] = MSMON_HEAT_COUNT;
      }
    });
    let lo = Infinity;
    let hi = -Infinity;
    for (const row of values) {
      for (const v of row) {
        if (v == null) continue;
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
    const scale = this.view.scale === "linear" || !(lo > 0) ? "linear"
      : this.view.scale === "log" || this.spec.log !== false ? "log" : "linear";
    return { cols, values, bad, lo, hi, scale };
  }

  // where a value sits on the colour scale, 0..1
  position(v, g) {
    if (!(g.hi > g.lo)) return 0.5;
    if (g.scale === "log") return (Math.log10(v) - Math.log10(g.lo)) / (Math.log10(g.hi) - Math.log10(g.lo));
    return (v - g.lo) / (g.hi - g.lo);
  }

  set(rows, view = {}) {
    this.rows = rows;
    this.view = { ...this.view, ...view };
    const has = rows.some((r) => r.xs.length || (r.nonfinite || []).length);
    this.empty.style.display = has ? "none" : "";
    this.canvas.style.display = has ? "" : "none";
    const width = Math.max(240, this.view.width || this.el.clientWidth || 420);
    if (has) this.paint(width);
    else this.grid = null;
    let last = -1;
    for (const r of rows) if (r.xs.length) last = Math.max(last, r.xs[r.xs.length - 1]);
    this.version += 1;
    this.el.dataset.lastStep = String(last);
    this.el.dataset.stat = this.stat || "";
    this.el.dataset.rows = String(rows.length);
    this.el.dataset.cols = String(this.grid ? this.grid.cols.length : 0);
    this.el.dataset.bad = String(this.grid ? this.grid.bad.flat().filter((b) => b != null).length : 0);
    this.el.dataset.scale = this.grid ? this.grid.scale : "";
    this.el.dataset.version = String(this.version);
  }

  paint(width) {
    const ctx0 = this.canvas.getContext("2d");
    ctx0.font = "11px sans-serif";
    const labelW = Math.min(160, 8 + Math.max(30, ...this.rows.map((r) => ctx0.measureText(r.row).width)));
    const barW = 70; // the colour bar and its values
    const plotW = Math.max(60, width - labelW - barW - 8);
    const g = this.layout(this.rows, Math.max(1, Math.min(MSMON_HEAT_MAX_COLS, Math.floor(plotW / 2))));
    const n = this.rows.length;
    const cellH = Math.max(6, Math.min(18, Math.floor(200 / Math.max(1, n))));
    const top = 4;
    const plotH = cellH * n;
    const height = top + plotH + 20;
    const cellW = plotW / Math.max(1, g.cols.length);
    const dpr = window.devicePixelRatio || 1;
    // a canvas is reallocated only when its size changes (setting width clears it anyway)
    if (this.canvas.width !== Math.round(width * dpr)) this.canvas.width = Math.round(width * dpr);
    if (this.canvas.height !== Math.round(height * dpr)) this.canvas.height = Math.round(height * dpr);
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px sans-serif";
    ctx.textBaseline = "middle";
    const left = labelW;
    ctx.fillStyle = "#333";
    ctx.textAlign = "right";
    for (let i = 0; i < n; i++) {
      let label = this.rows[i].row;
      while (label.length > 4 && ctx.measureText(label).width > labelW - 8) label = `…${label.slice(2)}`;
      if (cellH >= 9) ctx.fillText(label, left - 4, top + i * cellH + cellH / 2);
    }
    // the cells as one pixel each of a cols x rows image, scaled up unsmoothed: thousands
    // of cells cost one drawImage, not a fillRect and a colour string each
    const cells = new ImageData(Math.max(1, g.cols.length), Math.max(1, n));
    const px = cells.data;
    const red = rgbOf(MSMON_HEAT_BAD);
    const empty = rgbOf(MSMON_HEAT_EMPTY);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < g.cols.length; j++) {
        const v = g.values[i][j];
        const rgb = g.bad[i][j] != null ? red
          : v == null ? empty : MSMON_HEAT_LUT[Math.round(255 * Math.min(1, Math.max(0, this.position(v, g))))];
        const o = 4 * (i * g.cols.length + j);
        px[o] = rgb[0];
        px[o + 1] = rgb[1];
        px[o + 2] = rgb[2];
        px[o + 3] = 255;
      }
    }
    if (!this.scratch) this.scratch = document.createElement("canvas");
    this.scratch.width = cells.width;
    this.scratch.height = cells.height;
    this.scratch.getContext("2d").putImageData(cells, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.scratch, left, top, plotW, plotH);
    // the step axis: first, middle and last column
    ctx.fillStyle = "#555";
    ctx.textBaseline = "top";
    const marks = [...new Set([0, Math.floor((g.cols.length - 1) / 2), g.cols.length - 1])];
    for (const j of marks) {
      ctx.textAlign = j === 0 ? "left" : j === g.cols.length - 1 ? "right" : "center";
      const x = j === 0 ? left : j === g.cols.length - 1 ? left + plotW : left + (j + 0.5) * cellW;
      ctx.fillText(String(g.cols[j].lo), x, top + plotH + 4);
    }
    // the colour bar: the scale's ends and middle, with their values
    const bx = left + plotW + 8;
    const bh = Math.max(plotH, 40);
    const bar = ctx.createLinearGradient(0, top + bh, 0, top);
    MSMON_HEAT_STOPS.forEach((_, k, all) => bar.addColorStop(k / (all.length - 1),
      heatColor(k / (all.length - 1))));
    ctx.fillStyle = bar;
    ctx.fillRect(bx, top, 10, bh);
    ctx.fillStyle = "#333";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    const at = (t) => (g.scale === "log"
      ? 10 ** (Math.log10(g.lo) + t * (Math.log10(g.hi) - Math.log10(g.lo)))
      : g.lo + t * (g.hi - g.lo));
    const ticks = Number.isFinite(g.lo) ? [1, 0.5, 0] : [];
    for (const t of ticks) ctx.fillText(fmtNum(at(t)), bx + 13, top + (1 - t) * (bh - 1));
    const alerts = this.alertCells(g);
    ctx.lineWidth = 2;
    for (const a of alerts) {
      ctx.strokeStyle = MSMON_SEVERITY[a.severity] || "#333";
      ctx.strokeRect(left + a.col * cellW, top + a.row * cellH, Math.max(cellW, 3), cellH);
    }
    this.grid = { ...g, stat: this.stat, left, top, cellW, cellH, plotW, alerts,
      bar: ticks.map((t) => fmtNum(at(t))) };
  }

  // the alerts on this heatmap's modules as cells: [{row, col, step, severity, module}]
  // (row and col index the grid; an onset between columns takes the column holding it,
  // or the nearest)
  alertCells(g) {
    const prefix = `${this.spec.group}/`;
    const out = [];
    for (const a of this.view.alerts || []) {
      if (!a.tag || !a.tag.startsWith(prefix) || a.step == null || !g.cols.length) continue;
      const module = a.tag.slice(prefix.length, a.tag.lastIndexOf("/"));
      const row = this.rows.findIndex((r) => r.row === module);
      if (row < 0) continue;
      let col = g.cols.findIndex((c) => c.hi >= a.step);
      if (col < 0) col = g.cols.length - 1;
      else if (col > 0 && g.cols[col].lo > a.step
        && a.step - g.cols[col - 1].hi < g.cols[col].lo - a.step) col -= 1;
      out.push({ row, col, step: a.step, severity: a.severity, module });
    }
    return out;
  }

  // the cell under the cursor: module, step (or step range) and value in the tip
  hover(ev) {
    const g = this.grid;
    if (!g) return;
    const box = this.canvas.getBoundingClientRect();
    const x = ev.clientX - box.left;
    const y = ev.clientY - box.top;
    const i = Math.floor((y - g.top) / g.cellH);
    const j = Math.floor((x - g.left) / g.cellW);
    if (i < 0 || i >= this.rows.length || j < 0 || j >= g.cols.length) {
      this.tip.hidden = true;
      return;
    }
    this.tip.textContent = this.cellText(i, j);
    this.tip.style.left = `${Math.min(x + 12, box.width - 220)}px`;
    this.tip.style.top = `${y + 22}px`;
    this.tip.hidden = false;
    this.el.dataset.hover = `${i},${j}`;
  }

  cellText(i, j) {
    const g = this.grid;
    const c = g.cols[j];
    const steps = c.lo === c.hi ? `step ${c.lo}` : `steps ${c.lo}..${c.hi}`;
    const bad = g.bad[i][j];
    const v = g.values[i][j];
    const value = bad != null && bad !== MSMON_HEAT_COUNT ? bad
      : v == null ? "-" : fmtNum(v);
    const note = bad === MSMON_HEAT_COUNT ? " (non-finite values in the output)" : "";
    return `${this.rows[i].row} · ${steps} · ${g.stat} ${value}${note}`;
  }

  resize(width) {
    if (this.grid) this.paint(Math.max(240, width));
  }

  unzoom() {}

  destroy() { this.grid = null; }

  // what is drawn, for tests: rows, columns, cell values ("nan"/"inf" where marked) and
  // where each cell is on the canvas (CSS px from the canvas's top left)
  drawn() {
    const g = this.grid;
    if (!g) return { stat: null, rows: this.rows.map((r) => r.row), cols: [], cells: [], alerts: [] };
    return {
      stat: g.stat,
      rows: this.rows.map((r) => r.row),
      cols: g.cols,
      cells: g.values.map((row, i) => row.map((v, j) => (g.bad[i][j] != null ? g.bad[i][j] : v))),
      scale: g.scale,
      range: [g.lo, g.hi],
      bar: g.bar,
      alerts: g.alerts,
      geometry: { left: g.left, top: g.top, cellW: g.cellW, cellH: g.cellH },
    };
  }
}

// A snapshot's activation entries ({kind: "activations", name: "act/<module>", label, step,
// reason, stats}) as a table: a row per module (in the order recorded: forward order) with
// its statistics at that step, rows holding a non-finite value in red. `run`: a column
// naming the run (the viewer, several runs selected); both pages list them this way.
const MSMON_ACT_STATS = ["norm", "max_abs", "mean", MSMON_HEAT_COUNT, "zero_frac"];

function activationTable(entries, run = null) {
  const head = h("tr", {}, ...[...(run ? ["run"] : []), "step", "module", "reason",
    ...MSMON_ACT_STATS].map((t) => h("th", { text: t })));
  const rows = entries.map((e) => {
    const st = e.stats || {};
    const cells = MSMON_ACT_STATS.map((k) => h("td", { class: "num", text: fmtNum(st[k]) }));
    const row = h("tr", { "data-act-snapshot": String(e.name), "data-step": String(e.step) },
      ...(run ? [h("td", { text: run })] : []), h("td", { class: "num", text: String(e.step) }),
      h("td", {}, h("code", { text: String(e.label ?? e.name) })),
      h("td", { text: e.reason || "" }), ...cells);
    const bad = MSMON_ACT_STATS.some((k) => {
      const v = st[k];
      return typeof v === "string" || (typeof v === "number" && !Number.isFinite(v));
    }) || (typeof st.nonfinite === "number" && st.nonfinite > 0);
    if (bad) {
      row.style.color = MSMON_HEAT_BAD;
      row.dataset.bad = "1";
    }
    return row;
  });
  return h("table", { class: "msmon-act-snaps" }, head, ...rows);
}
