// msmon view: run list, charts per tag comparing the selected runs, live tail, zoom to raw.
//
// Data contract (msmon_nb/viewer/api.py): /api/scalars returns min/max-downsampled points;
// a non-finite value is null in `values` and listed in `nonfinite` with its kind, so it is
// drawn as a marker instead of vanishing. Zooming refetches the visible step range, which
// the server returns raw once it holds few enough points.
//
// A run with several ranks is drawn either as one line per rank (rank=K) or as a band:
// the mean across ranks with the ranks' min..max shaded (rank=all, where the server keeps
// each bucket's lowest minimum and highest maximum, so one rank's spike survives).
"use strict";

const MAX_POINTS = 1000;
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const GROUP_ORDER = ["train", "val", "sys"];
const FETCH_CONCURRENCY = 4;
const LINES_UP_TO = 8;    // runs with more ranks start as a band

const state = {
  runs: [],               // from /api/runs
  selected: new Set(),    // run names
  colors: new Map(),      // run name -> colour, stable while the page lives
  charts: new Map(),      // tag -> {div, zoom: [x0, x1] | null, data: Map(run -> drawn)}
                          // drawn: {mode: "single" | "band", series} or {mode: "lines", ranks: [[k, series]]}
  rankMode: new Map(),    // run -> "lines" | "band", for runs with several ranks
  ranksOpen: new Map(),   // run -> whether its rank list is unfolded
  alerts: new Map(),      // run -> [alert]
  snapshots: new Map(),   // run -> [snapshot]
  yscale: "linear",
  smoothing: 0,
  token: null,            // from /api/info: sent back with each control request
};

// --- small helpers -------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

async function getJSON(url) {
  const resp = await fetch(url, { cache: "no-store" });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || `${resp.status} ${url}`);
  return body;
}

// A small queue so that selecting a run with 40 tags does not open 40 connections at once.
const queue = [];
let inFlight = 0;
function limited(task) {
  return new Promise((resolve, reject) => {
    queue.push({ task, resolve, reject });
    pump();
  });
}
function pump() {
  while (inFlight < FETCH_CONCURRENCY && queue.length) {
    const { task, resolve, reject } = queue.shift();
    inFlight += 1;
    task().then(resolve, reject).finally(() => { inFlight -= 1; pump(); });
  }
}

function age(seconds) {
  if (seconds == null) return "-";
  const delta = Math.max(0, Date.now() / 1000 - seconds);
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (delta >= size) return `${Math.floor(delta / size)}${unit}`;
  }
  return `${Math.floor(delta)}s`;
}

function fmt(value) {
  if (value == null) return "-";
  if (typeof value === "string") return value;  // "nan", "inf", "-inf" from the API
  if (Number.isInteger(value)) return String(value);
  return Number(value).toPrecision(5);
}

// TensorBoard's debiased exponential moving average; non-finite points stay gaps.
function ema(values, weight) {
  const out = [];
  let last = 0;
  let count = 0;
  for (const v of values) {
    if (v == null || !Number.isFinite(v)) { out.push(null); continue; }
    last = last * weight + (1 - weight) * v;
    count += 1;
    out.push(weight > 0 ? last / (1 - Math.pow(weight, count)) : v);
  }
  return out;
}

function colorOf(run) {
  if (!state.colors.has(run)) state.colors.set(run, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(run);
}

// The run's colour, darker for low ranks and lighter for high ones.
function rankColor(run, index, count) {
  const base = colorOf(run);
  const t = count > 1 ? index / (count - 1) - 0.5 : 0;  // -0.5 .. 0.5
  const mix = (c) => Math.round(t < 0 ? c * (1 + t) : c + (255 - c) * t);
  const [r, g, b] = [1, 3, 5].map((i) => mix(parseInt(base.slice(i, i + 2), 16)));
  return `rgb(${r}, ${g}, ${b})`;
}

function withAlpha(hex, alpha) {
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  return `rgba(${r}, ${g}, ${b}, ${alpha})`;
}

function isRanked(run) {
  return (run.ranks || []).length > 1;
}

function modeOf(run) {
  if (!isRanked(run)) return "single";
  if (!state.rankMode.has(run.name)) {
    state.rankMode.set(run.name, run.ranks.length <= LINES_UP_TO ? "lines" : "band");
  }
  return state.rankMode.get(run.name);
}

// Ranks to flag in the run list: process gone, or named by a rank_stopped alert (hung).
function flaggedRanks(run) {
  const flagged = new Set();
  for (const [k, status] of Object.entries(run.rank_status || {})) {
    if (status === "interrupted") flagged.add(Number(k));
  }
  for (const a of state.alerts.get(run.name) || []) {
    if (a.kind === "rank_stopped" && a.rank != null) flagged.add(a.rank);
  }
  return flagged;
}

// --- run list --------------------------------------------------------------------------

async function loadRuns() {
  state.runs = await getJSON("/api/runs");
  const names = new Set(state.runs.map((r) => r.name));
  for (const name of [...state.selected]) if (!names.has(name)) state.selected.delete(name);
  if (!state.initialised && state.runs.length) {
    state.initialised = true;
    // Start with what is most likely wanted: the runs being written, else the newest.
    const running = state.runs.filter((r) => r.status === "running");
    const pick = running.length ? running : [...state.runs]
      .sort((a, b) => (b.last_write || 0) - (a.last_write || 0)).slice(0, 1);
    for (const r of pick) state.selected.add(r.name);
    renderRuns();
    await refreshAll();
    return;
  }
  renderRuns();
  syncCharts();
}

function renderRuns() {
  const body = document.querySelector("#runs tbody");
  const filter = document.getElementById("run-filter").value.trim().toLowerCase();
  body.replaceChildren();
  for (const run of state.runs) {
    if (filter && !run.name.toLowerCase().includes(filter)) continue;
    const box = el("input", { type: "checkbox", "aria-label": `select ${run.name}` });
    box.checked = state.selected.has(run.name);
    box.addEventListener("click", (ev) => { ev.stopPropagation(); toggleRun(run.name); });
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = state.selected.has(run.name) ? colorOf(run.name) : "transparent";
    const row = el("tr", { "data-run": run.name },
      el("td", {}, box),
      el("td", { class: "name" }, swatch, run.name),
      el("td", {}, el("span", { class: `status ${run.status}`, text: run.status })),
      el("td", { class: "num", text: run.last_step == null ? "-" : String(run.last_step) }),
      el("td", { class: "num age", "data-last-write": run.last_write ?? "", text: age(run.last_write) }));
    row.addEventListener("click", () => toggleRun(run.name));
    body.append(row);
    if (isRanked(run)) {
      row.classList.add("has-ranks");
      body.append(el("tr", { class: "ranks-row", "data-ranks-of": run.name },
        el("td"), el("td", { colspan: "4" }, rankControls(run))));
    }
  }
  document.getElementById("runs-empty").hidden = state.runs.length > 0;
  renderControls();
}

// A selected run that is still being written gets the panel's buttons: POSTed to
// /api/control with the server's token, acted on by the run's monitor at its next step
// boundary (msmon ctl does the same from a terminal).
function renderControls() {
  const box = document.getElementById("controls");
  const live = state.runs.filter((r) => state.selected.has(r.name) && r.status === "running");
  const keep = new Map([...box.children].map((row) => [row.dataset.run, row]));
  box.replaceChildren(...live.map((run) => keep.get(run.name) || controlRow(run.name)));
  box.hidden = live.length === 0;
}

function controlRow(name) {
  const msg = el("span", { class: "muted control-msg" });
  const freq = el("input", { type: "number", min: "1", step: "1", value: "10",
    class: "control-freq", "aria-label": "collect every N steps" });
  const button = (label, cmd, arg = null) => {
    const b = el("button", { type: "button", "data-cmd": cmd, text: label });
    b.addEventListener("click", () => control(name, cmd, arg && arg(), msg));
    return b;
  };
  return el("div", { class: "control-row", "data-run": name },
    el("b", { text: name }), button("Pause", "pause"), button("Resume", "resume"),
    button("Stop", "stop"), el("label", {}, "collect every ", freq),
    button("Set", "freq", () => Number(freq.value)), button("Snapshot", "snapshot"), msg);
}

async function control(run, cmd, arg, msgEl) {
  msgEl.textContent = `${cmd}: sent`;
  try {
    const resp = await fetch("/api/control", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Msmon-Token": state.token || "" },
      body: JSON.stringify({ run, cmd, arg: arg ?? null }),
    });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || String(resp.status));
    msgEl.textContent = body.queued ? body.message : body.acks.map((a) => a.message).join("; ");
  } catch (err) {
    msgEl.textContent = `${cmd} failed: ${err.message}`;
  }
}

// Under a run with several ranks: the lines/band toggle and each rank's last step and status.
function rankControls(run) {
  const mode = modeOf(run);
  const toggle = el("span", { class: "rank-mode", role: "group", "aria-label": `draw the ranks of ${run.name} as` });
  for (const [value, label] of [["lines", "per-rank lines"], ["band", "band"]]) {
    const button = el("button", { type: "button", "data-mode": value, text: label,
      "aria-pressed": String(mode === value) });
    button.addEventListener("click", () => setRankMode(run.name, value));
    toggle.append(button);
  }
  const flagged = flaggedRanks(run);
  const list = el("ul");
  for (const k of run.ranks) {
    const status = (run.rank_status || {})[k] || "";
    const last = (run.rank_last_step || {})[k];
    const item = el("li", { class: `rank${flagged.has(k) ? " flagged" : ""}`, "data-rank": String(k),
      "data-status": status, title: flagged.has(k) ? "this rank stopped while others went on" : "" },
    el("span", { class: "rank-name", text: `rank ${k}` }),
    el("span", { class: "num rank-step", text: last == null ? "-" : `step ${last}` }));
    if (status) item.append(el("span", { class: `status ${status}`, text: status }));
    list.append(item);
  }
  const summary = el("summary", { text: `${run.ranks.length} ranks` });
  if (flagged.size) summary.append(el("span", { class: "flag", text: ` · ${flagged.size} stopped` }));
  const details = el("details", { class: "rank-list" }, summary, list);
  details.open = state.ranksOpen.get(run.name) ?? (run.ranks.length <= LINES_UP_TO || flagged.size > 0);
  details.addEventListener("toggle", () => state.ranksOpen.set(run.name, details.open));
  return el("div", { class: "ranks" }, toggle, details);
}

function setRankMode(name, mode) {
  if (state.rankMode.get(name) === mode) return;
  state.rankMode.set(name, mode);
  renderRuns();
  for (const [tag, chart] of state.charts) {
    chart.data.delete(name);
    fetchChart(tag, name);
  }
}

function toggleRun(name) {
  if (state.selected.has(name)) state.selected.delete(name);
  else state.selected.add(name);
  renderRuns();
  refreshAll();
}

// --- charts --------------------------------------------------------------------------

function selectedRuns() {
  return state.runs.filter((r) => state.selected.has(r.name));
}

function groupOf(tag) {
  const cut = tag.indexOf("/");
  return cut < 0 ? "other" : tag.slice(0, cut);
}

function groupRank(group) {
  const i = GROUP_ORDER.indexOf(group);
  return i < 0 ? GROUP_ORDER.length + (group === "other" ? 1 : 0) : i;
}

// Create or remove chart divs so there is one per tag of the selected runs, grouped.
function syncCharts() {
  const tags = new Set();
  for (const run of selectedRuns()) for (const tag of run.tags) tags.add(tag);
  for (const [tag, chart] of state.charts) {
    if (!tags.has(tag)) { Plotly.purge(chart.div); chart.div.remove(); state.charts.delete(tag); }
  }
  const container = document.getElementById("charts");
  const sorted = [...tags].sort((a, b) =>
    groupRank(groupOf(a)) - groupRank(groupOf(b)) || a.localeCompare(b));
  for (const tag of sorted) {
    if (state.charts.has(tag)) continue;
    const group = groupOf(tag);
    let section = container.querySelector(`section.group[data-group="${CSS.escape(group)}"]`);
    if (!section) {
      section = el("section", { class: "group", "data-group": group },
        el("h2", { text: group }), el("div", { class: "grid" }));
      const after = [...container.children].find((s) => groupRank(s.dataset.group) > groupRank(group)
        || (groupRank(s.dataset.group) === groupRank(group) && s.dataset.group > group));
      container.insertBefore(section, after || null);
    }
    const div = el("div", { class: "chart", "data-tag": tag, id: `chart-${tag}` });
    const grid = section.querySelector(".grid");
    const next = [...grid.children].find((c) => c.dataset.tag > tag);
    grid.insertBefore(div, next || null);
    state.charts.set(tag, { div, zoom: null, data: new Map(), version: 0 });
  }
  for (const section of [...container.children]) {
    if (!section.querySelector(".chart")) section.remove();
  }
  document.getElementById("hint").hidden = state.selected.size > 0;
}

function scalarsURL(run, tag, zoom, rank = null) {
  const params = new URLSearchParams({ run, tag, max_points: String(MAX_POINTS) });
  if (rank != null) params.set("rank", String(rank));
  if (zoom) {
    params.set("start", String(Math.floor(zoom[0])));
    params.set("end", String(Math.ceil(zoom[1])));
  }
  return `/api/scalars?${params}`;
}

async function fetchChart(tag, onlyRun = null) {
  const chart = state.charts.get(tag);
  if (!chart) return;
  const zoom = chart.zoom;
  const runs = selectedRuns().filter((r) => r.tags.includes(tag) && (!onlyRun || r.name === onlyRun));
  await Promise.all(runs.map(async (run) => {
    try {
      const drawn = await fetchDrawn(run, tag, zoom);
      if (chart.zoom === zoom && drawn.mode === modeOf(run)) chart.data.set(run.name, drawn);
    } catch (err) {
      console.warn(`msmon: ${run.name} ${tag}: ${err.message}`);
    }
  }));
  for (const name of [...chart.data.keys()]) if (!state.selected.has(name)) chart.data.delete(name);
  draw(tag);
}

// What one run contributes to a chart: its series, one per rank, or the ranks merged.
async function fetchDrawn(run, tag, zoom) {
  const mode = modeOf(run);
  if (mode !== "lines") {
    const rank = mode === "band" ? "all" : null;
    return { mode, series: await limited(() => getJSON(scalarsURL(run.name, tag, zoom, rank))) };
  }
  const parts = await Promise.all(run.ranks.map((k) =>
    limited(() => getJSON(scalarsURL(run.name, tag, zoom, k))).then((s) => [k, s], () => null)));
  return { mode, ranks: parts.filter(Boolean) };  // a rank without this tag is left out
}

function alertTraces(tag) {
  const traces = [];
  for (const run of selectedRuns()) {
    const items = (state.alerts.get(run.name) || []).filter((a) => !a.tag || a.tag === tag);
    if (!items.length) continue;
    const ranked = isRanked(run);
    const describe = (a) => `${run.name}${a.rank != null && ranked ? ` rank ${a.rank}` : ""}: ${a.message}`;
    traces.push({
      x: items.map((a) => a.step), y: items.map(() => 0.9), yaxis: "y2",
      type: "scatter", mode: ranked ? "markers+text" : "markers", name: `${run.name} alerts`, meta: "alert",
      marker: { symbol: "diamond", size: 11, color: items.map((a) =>
        a.severity === "critical" ? "#cf222e" : "#bf8700"), line: { color: colorOf(run.name), width: 1.5 } },
      // ranked runs label each marker with its rank; the message is in the hover text
      text: ranked ? items.map((a) => (a.rank != null ? `rank ${a.rank}` : "")) : items.map(describe),
      hovertext: items.map(describe), textposition: "bottom center",
      textfont: { size: 10, color: "#cf222e" }, hoverinfo: "text+x", showlegend: false,
    });
  }
  return traces;
}

// The line of one series (plus its smoothed line and NaN/Inf markers).
function lineTraces(label, s, color, showlegend) {
  const traces = [];
  const smoothing = state.smoothing > 0;
  traces.push({
    x: s.steps, y: s.values, type: "scatter", mode: s.steps.length < 60 ? "lines+markers" : "lines",
    name: label, meta: "series", line: { color, width: smoothing ? 1 : 1.6 },
    marker: { size: 4 }, opacity: smoothing ? 0.3 : 1, showlegend: showlegend && !smoothing,
    hovertemplate: `${label}<br>step %{x}<br>%{y:.6g}<extra></extra>`,
  });
  if (smoothing) {
    traces.push({
      x: s.steps, y: ema(s.values, state.smoothing), type: "scatter", mode: "lines",
      name: label, meta: "smoothed", line: { color, width: 2 }, showlegend,
      hovertemplate: `${label} (smoothed)<br>step %{x}<br>%{y:.6g}<extra></extra>`,
    });
  }
  if (s.nonfinite.steps.length) {
    traces.push({
      x: s.nonfinite.steps, y: s.nonfinite.steps.map(() => 1), yaxis: "y2",
      type: "scatter", mode: "markers", name: `${label} NaN/Inf`, meta: "nonfinite",
      marker: { symbol: "x", size: 10, color: "#cf222e", line: { color, width: 1 } },
      text: s.nonfinite.kinds.map((k, i) => `${label}: ${k.toUpperCase()} at step ${s.nonfinite.steps[i]}`),
      hoverinfo: "text", showlegend: false,
    });
  }
  return traces;
}

// The ranks' min..max as a shaded band (lower edge, then upper edge filled down to it).
function bandTraces(label, s, color) {
  const common = { x: s.steps, type: "scatter", mode: "lines", meta: "band", showlegend: false,
    line: { width: 0, color }, hoverinfo: "skip" };
  return [
    { ...common, y: s.band_min, name: `${label} min` },
    { ...common, y: s.band_max, name: `${label} max`, fill: "tonexty", fillcolor: withAlpha(color, 0.22) },
  ];
}

function draw(tag) {
  const chart = state.charts.get(tag);
  if (!chart) return;
  const traces = [];
  let raw = true;
  let points = 0;
  let nonfinite = 0;
  let legend = 0;
  for (const run of selectedRuns()) {
    const drawn = chart.data.get(run.name);
    if (!drawn) continue;
    const color = colorOf(run.name);
    const parts = drawn.mode === "lines" ? drawn.ranks : [[null, drawn.series]];
    for (const [i, [k, s]] of parts.entries()) {
      raw = raw && s.raw;
      points += s.steps.length;
      nonfinite += s.nonfinite.steps.length;
      legend += 1;
      if (drawn.mode === "lines") {
        traces.push(...lineTraces(`${run.name} rank ${k}`, s, rankColor(run.name, i, parts.length),
          parts.length <= LINES_UP_TO));
      } else if (drawn.mode === "band") {
        traces.push(...bandTraces(run.name, s, color));
        traces.push(...lineTraces(`${run.name} mean of ${run.ranks.length} ranks`, s, color, true));
      } else {
        traces.push(...lineTraces(run.name, s, color, true));
      }
    }
  }
  traces.push(...alertTraces(tag));
  const note = points === 0 ? "" : raw ? " · raw points" : " · min/max per bucket";
  const layout = {
    title: { text: `${tag}<span style="font-size:11px;color:#656d76">${note}</span>`, font: { size: 13 }, x: 0.02 },
    margin: { l: 55, r: 15, t: 32, b: 35 },
    xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
    yaxis: { type: state.yscale, exponentformat: "e" },
    yaxis2: { overlaying: "y", range: [0, 1.05], visible: false, fixedrange: true },
    legend: { orientation: "h", y: -0.25, font: { size: 11 } },
    showlegend: legend > 1,
    hovermode: "closest", dragmode: "zoom",
    // A new revision per zoom: the y axis fits the points fetched for the zoomed range.
    uirevision: chart.zoom ? `${tag} ${chart.zoom.join(" ")}` : tag,
  };
  if (chart.zoom) {
    layout.xaxis.range = [...chart.zoom];  // a copy: Plotly writes the user's zoom into it
    layout.xaxis.autorange = false;
  }
  Plotly.react(chart.div, traces, layout, { displaylogo: false, responsive: true, showTips: false });
  chart.version += 1;
  chart.div.dataset.raw = String(raw && points > 0);
  chart.div.dataset.points = String(points);
  chart.div.dataset.nonfinite = String(nonfinite);
  chart.div.dataset.version = String(chart.version);
  if (!chart.listening) {
    chart.listening = true;
    chart.div.on("plotly_relayout", (ev) => onRelayout(tag, ev));
  }
}

function onRelayout(tag, ev) {
  const chart = state.charts.get(tag);
  if (!chart) return;
  if (ev["xaxis.range[0]"] !== undefined && ev["xaxis.range[1]"] !== undefined) {
    const zoom = [Number(ev["xaxis.range[0]"]), Number(ev["xaxis.range[1]"])];
    if (chart.zoom && chart.zoom[0] === zoom[0] && chart.zoom[1] === zoom[1]) return;
    chart.zoom = zoom;
    fetchChart(tag);
  } else if (ev["xaxis.autorange"] && chart.zoom) {
    chart.zoom = null;
    fetchChart(tag);
  }
}

function resetZoom() {
  for (const [tag, chart] of state.charts) {
    chart.zoom = null;
    Plotly.relayout(chart.div, { "xaxis.autorange": true, "yaxis.autorange": true });
    fetchChart(tag);
  }
}

// --- alerts and snapshots ---------------------------------------------------------------

async function loadSide(run) {
  try {
    const [alerts, snaps] = await Promise.all([
      getJSON(`/api/alerts?${new URLSearchParams({ run })}`),
      getJSON(`/api/snapshots?${new URLSearchParams({ run })}`),
    ]);
    state.alerts.set(run, alerts);
    state.snapshots.set(run, snaps);
  } catch (err) {
    console.warn(`msmon: ${run}: ${err.message}`);
  }
}

function renderSide() {
  const alertsBody = document.querySelector("#alerts tbody");
  alertsBody.replaceChildren();
  const snapsBody = document.querySelector("#snapshots tbody");
  snapsBody.replaceChildren();
  let nAlerts = 0;
  let nSnaps = 0;
  for (const run of selectedRuns()) {
    for (const a of state.alerts.get(run.name) || []) {
      nAlerts += 1;
      alertsBody.append(el("tr", { "data-kind": a.kind || "", "data-rank": a.rank ?? "" },
        el("td", { text: run.name }), el("td", { class: "num", text: a.rank == null ? "-" : String(a.rank) }),
        el("td", { class: "num", text: fmt(a.step) }),
        el("td", { class: "num", text: fmt(a.since_step) }),
        el("td", { class: `severity-${a.severity}`, text: a.severity || "-" }),
        el("td", { text: a.kind || "-" }), el("td", { text: a.message || "" })));
    }
    for (const s of state.snapshots.get(run.name) || []) {
      nSnaps += 1;
      const st = s.stats || {};
      snapsBody.append(el("tr", { "data-snapshot": s.name },
        el("td", { text: run.name }), el("td", { class: "num", text: fmt(s.step) }),
        el("td", { text: s.name }), el("td", { text: s.reason || "-" }),
        el("td", { text: s.shape ? `[${s.shape.join(", ")}]` : "-" }), el("td", { text: s.dtype || "-" }),
        el("td", { class: "num", text: fmt(st.min) }), el("td", { class: "num", text: fmt(st.max) }),
        el("td", { class: "num", text: fmt(st.mean) }), el("td", { class: "num", text: fmt(st.std) }),
        el("td", { class: "num", text: fmt(st.nan_count) }), el("td", { class: "num", text: fmt(st.inf_count) }),
        el("td", {}, histogramSVG(s.histogram))));
    }
  }
  document.getElementById("alerts-section").hidden = nAlerts === 0;
  document.getElementById("snapshots-section").hidden = nSnaps === 0;
}

function histogramSVG(hist) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "hist");
  svg.setAttribute("width", "160");
  svg.setAttribute("height", "36");
  if (!hist || !hist.counts.length) return svg;
  const top = Math.max(...hist.counts, 1);
  const w = 160 / hist.counts.length;
  hist.counts.forEach((c, i) => {
    const h = (34 * c) / top;
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", String(i * w));
    rect.setAttribute("y", String(36 - h));
    rect.setAttribute("width", String(Math.max(w - 0.5, 0.5)));
    rect.setAttribute("height", String(h));
    const title = document.createElementNS(ns, "title");
    title.textContent = `${fmt(hist.edges[i])} .. ${fmt(hist.edges[i + 1])}: ${c}`;
    rect.append(title);
    svg.append(rect);
  });
  const label = document.createElementNS(ns, "title");
  label.textContent = `min ${fmt(hist.min)} max ${fmt(hist.max)} count ${hist.count}`;
  svg.prepend(label);
  return svg;
}

// --- refresh ------------------------------------------------------------------------------

const relisted = new Set();
async function refreshAll() {
  syncCharts();
  const runs = selectedRuns().map((r) => r.name);
  // Alerts and snapshots load beside the charts (a big job's cross-rank alerts come later
  // than its charts); once here, they are drawn onto whatever the charts hold.
  const side = Promise.all(runs.map(loadSide)).then(() => {
    renderSide();
    if (selectedRuns().some(isRanked)) renderRuns();  // rank_stopped alerts flag their ranks
    for (const [tag, chart] of state.charts) if (chart.data.size) draw(tag);
  });
  await Promise.all([side, ...[...state.charts.keys()].map((tag) => fetchChart(tag))]);
  // A long run is listed from the start and end of its files; once the server has loaded
  // it (the fetches above), the listing has every tag, so ask for it once more.
  const inexact = selectedRuns().filter((r) => !r.exact && !relisted.has(r.name));
  if (inexact.length) {
    for (const r of inexact) relisted.add(r.name);
    scheduleRunsReload();
  }
}

// Live tail: at most one refetch of a run's charts per second, one in flight at a time;
// events that arrive meanwhile fold into a single later refetch.
const LIVE_MIN_MS = 1000;
const live = new Map();  // run -> {busy, again, last}
function refreshRun(run) {
  if (!state.selected.has(run)) return;
  const entry = live.get(run) || { busy: false, again: false, last: 0 };
  live.set(run, entry);
  if (entry.busy) { entry.again = true; return; }
  entry.busy = true;
  const wait = Math.max(0, entry.last + LIVE_MIN_MS - Date.now());
  setTimeout(async () => {
    entry.last = Date.now();
    try {
      const tags = [...state.charts].filter(([, chart]) => !chart.zoom).map(([tag]) => tag);
      await Promise.all(tags.map((tag) => fetchChart(tag, run)));
    } finally {
      entry.busy = false;
      if (entry.again) { entry.again = false; refreshRun(run); }
    }
  }, wait);
}

let runsTimer = null;
function scheduleRunsReload() {
  if (runsTimer) return;
  runsTimer = setTimeout(async () => {
    runsTimer = null;
    const before = new Set(state.charts.keys());
    await loadRuns();
    const added = [...state.charts.keys()].filter((t) => !before.has(t));
    await Promise.all(added.map((tag) => fetchChart(tag)));
  }, 300);
}

function connect() {
  const live = document.getElementById("live");
  const source = new EventSource("/api/stream");
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  source.addEventListener("error", () => { live.textContent = "offline"; live.className = "live off"; });
  source.addEventListener("hello", (ev) => {
    document.getElementById("base").textContent = JSON.parse(ev.data).base;
  });
  source.addEventListener("runs", scheduleRunsReload);
  source.addEventListener("data", (ev) => {
    const { run } = JSON.parse(ev.data);
    scheduleRunsReload();
    refreshRun(run);
  });
  source.addEventListener("alerts", async (ev) => {
    const { run } = JSON.parse(ev.data);
    if (!state.selected.has(run)) return;
    await loadSide(run);
    renderSide();
    renderRuns();  // a rank_stopped alert flags its rank in the list
    for (const tag of state.charts.keys()) draw(tag);
  });
}

function init() {
  document.getElementById("yscale").addEventListener("change", (ev) => {
    state.yscale = ev.target.value;
    for (const tag of state.charts.keys()) draw(tag);
  });
  const smooth = document.getElementById("smooth");
  smooth.addEventListener("input", () => {
    state.smoothing = Number(smooth.value);
    document.getElementById("smooth-value").textContent = state.smoothing.toFixed(2);
    for (const tag of state.charts.keys()) draw(tag);
  });
  document.getElementById("reset-zoom").addEventListener("click", resetZoom);
  document.getElementById("run-filter").addEventListener("input", renderRuns);
  setInterval(() => {
    for (const cell of document.querySelectorAll("#runs td.age")) {
      const t = cell.dataset.lastWrite;
      cell.textContent = age(t === "" ? null : Number(t));
    }
  }, 1000);
  connect();
  getJSON("/api/info").then((info) => { state.token = info.control_token; })
    .catch((err) => console.error(`msmon: ${err.message}`));
  loadRuns().catch((err) => console.error(`msmon: ${err.message}`));
}

window.msmon = { state, ema };
init();
