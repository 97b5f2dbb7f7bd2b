// msmon view: run list, the selected runs' charts compared, live tail, zoom to raw.
//
// The charts are the notebook panel's: planned by the same code (/api/charts, in the
// panel's order) and drawn by the same component (/vendor/chart.js: MsmonChart, ema,
// fmtNum, histogramSVG, h; /vendor/heatmap.js: MsmonHeatmap, the activations' module x
// step chart), loaded before this file. Data contract (msmon_nb/viewer/api.py): /api/scalars returns min/max-downsampled points;
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
const FETCH_CONCURRENCY = 4;
const LINES_UP_TO = 8;    // runs with more ranks start as a band
// rank rows drawn at once in a big job's list: its notable ranks (stopped, named by an
// alert or as a chart's outlier) come first, the rest are found with the search box
// (a 1,024-rank job drew 1,024 rows and named none of its outliers: bench/long.py)
const RANK_ROWS = 32;

const state = {
  runs: [],               // from /api/runs
  selected: new Set(),    // run names
  colors: new Map(),      // run name -> colour, stable while the page lives
  plan: [],               // from /api/charts: [{title, tags, labels, note, log, group}]
  charts: new Map(),      // chart id -> {spec, chart: MsmonChart, zoom: [x0, x1] | null,
                          //   data: Map("run\ttag" -> drawn)}; drawn: {mode: "single" | "band",
                          //   series} or {mode: "lines", ranks: [[k, series]]}
  rankMode: new Map(),    // run -> "lines" | "band", for runs with several ranks
  ranksOpen: new Map(),   // run -> whether its rank list is unfolded
  rankQuery: new Map(),   // run -> what its rank list's search box holds
  outliers: new Map(),    // run -> Map(rank -> Set(tag)): ranks the merged charts name
  alerts: new Map(),      // run -> [alert]
  snapshots: new Map(),   // run -> [snapshot]
  interventions: new Map(), // run -> [intervention] (drawn as marks on every chart)
  checkpoints: new Map(), // run -> [{rank, step, path, bytes}]
  yscale: "auto",
  smoothing: 0,
  token: null,            // from /api/info: sent back with each control request
  commands: [],           // from /api/info: the command table the control rows are built from
};

// --- small helpers -------------------------------------------------------------------

const el = h; // the chart component's DOM helper

// Every URL of this page is relative (api/runs, not /api/runs), like index.html's assets:
// behind a proxy (JupyterLab's <lab>/msmon/, code-server's /proxy/8080/) the page lives
// under a path prefix the server never sees. tests/viewer/test_proxy.py checks it.
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

const fmt = fmtNum;

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
  state.runs = await getJSON("api/runs");
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
  await loadPlan();
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
// boundary (msmon ctl does the same from a terminal). The buttons are the commands of
// /api/info (the kernel's table, rundir.control.SPECS): this file knows none by name.
function renderControls() {
  const box = document.getElementById("controls");
  const live = state.runs.filter((r) => state.selected.has(r.name) && r.status === "running");
  const keep = new Map([...box.children].map((row) => [row.dataset.run, row]));
  box.replaceChildren(...live.map((run) => keep.get(run.name) || controlRow(run.name)));
  box.hidden = live.length === 0;
}

function controlRow(name) {
  const msg = el("span", { class: "muted control-msg" });
  const parts = [];
  for (const spec of state.commands) {
    const button = (label, arg = null) => {
      const b = el("button", { type: "button", "data-cmd": spec.name, text: label, title: spec.help });
      b.addEventListener("click", () => control(name, spec.name, arg && arg(), msg));
      return b;
    };
    if (!spec.arg) {
      parts.push(button(spec.label));
      continue;
    }
    // a command with an argument: its field (starting at the table's start, as on the
    // panel) and Set
    const input = el("input", { type: "number", min: String(spec.arg.min),
      step: spec.arg.kind === "int" ? "1" : "any", value: String(spec.arg.start),
      class: `control-${spec.name}`, "aria-label": spec.help });
    parts.push(el("label", {}, `${spec.label} `, input), button("Set", () => Number(input.value)));
  }
  return el("div", { class: "control-row", "data-run": name }, el("b", { text: name }), ...parts, msg);
}

async function control(run, cmd, arg, msgEl) {
  msgEl.textContent = `${cmd}: sent`;
  try {
    const resp = await fetch("api/control", {
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

// The ranks worth naming first, each with why: stopped, named by an alert, or drawn as
// an outlier on a merged chart (in that order).
function notableRanks(run) {
  const why = new Map();
  const add = (k, reason) => {
    if (!why.has(k)) why.set(k, []);
    if (!why.get(k).includes(reason)) why.get(k).push(reason);
  };
  for (const k of flaggedRanks(run)) add(k, "stopped");
  for (const a of state.alerts.get(run.name) || []) {
    if (a.rank != null && a.kind !== "rank_stopped") add(a.rank, a.kind);
  }
  for (const [k, tags] of state.outliers.get(run.name) || []) add(k, `outlier on ${[...tags].join(", ")}`);
  return why;
}

function rankItem(run, k, flagged, reasons = []) {
  const status = (run.rank_status || {})[k] || "";
  const last = (run.rank_last_step || {})[k];
  const item = el("li", { class: `rank${flagged.has(k) ? " flagged" : ""}`, "data-rank": String(k),
    "data-status": status, title: flagged.has(k) ? "this rank stopped while others went on" : "" },
  el("span", { class: "rank-name", text: `rank ${k}` }),
  el("span", { class: "num rank-step", text: last == null ? "-" : `step ${last}` }));
  if (status) item.append(el("span", { class: `status ${status}`, text: status }));
  if (reasons.length) item.append(el("span", { class: "rank-why", text: reasons.join("; ") }));
  return item;
}

// A big job's rank list: the rows matching the search box, at most RANK_ROWS of them.
function fillRankList(run, list, flagged) {
  const query = (state.rankQuery.get(run.name) || "").trim().toLowerCase();
  const matches = run.ranks.filter((k) => !query || [`rank ${k}`, (run.rank_status || {})[k] || "",
    `step ${(run.rank_last_step || {})[k] ?? ""}`].some((text) => text.toLowerCase().includes(query)));
  list.replaceChildren(...matches.slice(0, RANK_ROWS).map((k) => rankItem(run, k, flagged)));
  if (matches.length > RANK_ROWS) {
    list.append(el("li", { class: "rank-more",
      text: `… ${matches.length - RANK_ROWS} more: type a rank number or a status` }));
  } else if (!matches.length) {
    list.append(el("li", { class: "rank-more", text: `no rank matches "${query}"` }));
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
  const summary = el("summary", { text: `${run.ranks.length} ranks` });
  if (flagged.size) summary.append(el("span", { class: "flag", text: ` · ${flagged.size} stopped` }));
  const list = el("ul", { class: "rank-all" });
  const details = el("details", { class: "rank-list" }, summary);
  details.addEventListener("toggle", () => state.ranksOpen.set(run.name, details.open));
  if (run.ranks.length <= RANK_ROWS) {
    list.append(...run.ranks.map((k) => rankItem(run, k, flagged)));
    details.append(list);
    details.open = state.ranksOpen.get(run.name) ?? (run.ranks.length <= LINES_UP_TO || flagged.size > 0);
    return el("div", { class: "ranks" }, toggle, details);
  }
  const notable = notableRanks(run);
  const named = el("ul", { class: "rank-notable", "aria-label": `notable ranks of ${run.name}` });
  for (const [k, reasons] of [...notable].slice(0, RANK_ROWS)) named.append(rankItem(run, k, flagged, reasons));
  if (!notable.size) named.append(el("li", { class: "rank-more", text: "no outlier rank named yet" }));
  const search = el("input", { type: "search", class: "rank-search", placeholder: "rank number or status",
    "aria-label": `find a rank of ${run.name}`, value: state.rankQuery.get(run.name) || "" });
  search.addEventListener("input", () => {
    state.rankQuery.set(run.name, search.value);
    fillRankList(run, list, flagged);
  });
  fillRankList(run, list, flagged);
  details.append(search, list);
  details.open = state.ranksOpen.get(run.name) ?? false;
  return el("div", { class: "ranks" }, toggle, el("div", { class: "rank-list" }, named), details);
}

// Remember the ranks a merged chart draws as outliers; the run list names them first.
function noteOutliers(run, tag, series) {
  if (!series || !(series.outliers || []).length) return;
  if (!state.outliers.has(run.name)) state.outliers.set(run.name, new Map());
  const known = state.outliers.get(run.name);
  let added = false;
  for (const o of series.outliers) {
    if (!known.has(o.rank)) known.set(o.rank, new Set());
    if (!known.get(o.rank).has(tag)) { known.get(o.rank).add(tag); added = true; }
  }
  if (added && run.ranks.length > RANK_ROWS) renderRuns();
}

function setRankMode(name, mode) {
  if (state.rankMode.get(name) === mode) return;
  state.rankMode.set(name, mode);
  renderRuns();
  for (const [id, c] of state.charts) {
    for (const key of [...c.data.keys()]) if (key.split("\t")[0] === name) c.data.delete(key);
    fetchChart(id, name);
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

function chartWidth(chart) { return Math.max(200, chart.el.clientWidth - 8); }

// charts follow their grid cell's width
const resizer = new ResizeObserver((entries) => {
  for (const e of entries) e.target.msmonChart?.resize(chartWidth(e.target.msmonChart));
});

function chartId(spec) { return `${spec.title}|${spec.tags.join(",")}`; }

// The plan for the selected runs' tags together, from the server (the panel's planner).
let planFor = "";
async function loadPlan() {
  const names = selectedRuns().map((r) => r.name);
  const sig = JSON.stringify(selectedRuns().map((r) => [r.name, r.tags]));
  if (sig === planFor) return;
  planFor = sig;
  if (!names.length) { state.plan = []; return; }
  const params = new URLSearchParams();
  for (const n of names) params.append("run", n);
  state.plan = await getJSON(`api/charts?${params}`);
}

// Charts for the plan, in its order, under a heading per group; charts no longer planned go.
function syncCharts() {
  const ids = new Set(state.plan.map(chartId));
  for (const [id, c] of state.charts) {
    if (!ids.has(id)) {
      resizer.unobserve(c.chart.el);
      c.chart.destroy();
      c.chart.el.remove();
      state.charts.delete(id);
    }
  }
  const container = document.getElementById("charts");
  const sections = [];
  let section = null;
  for (const spec of state.plan) {
    const group = spec.group || "other";
    if (!section || section.dataset.group !== group) {
      section = container.querySelector(`section.group[data-group="${CSS.escape(group)}"]`)
        || el("section", { class: "group", "data-group": group },
          el("h2", { text: group }), el("div", { class: "grid" }));
      sections.push(section);
    }
    const id = chartId(spec);
    let c = state.charts.get(id);
    if (!c) {
      const chart = spec.kind === "heatmap" ? new MsmonHeatmap(spec, () => fetchChart(id))
        : new MsmonChart(spec, (range) => onZoom(id, range), 230);
      chart.el.id = `chart-${spec.tags[0]}`;
      c = { spec, chart, zoom: null, data: new Map() };
      state.charts.set(id, c);
      resizer.observe(chart.el);
    }
    section.querySelector(".grid").append(c.chart.el);
  }
  container.replaceChildren(...sections);
  document.getElementById("hint").hidden = state.selected.size > 0;
}

function scalarsURL(run, tag, zoom, rank = null) {
  const params = new URLSearchParams({ run, tag, max_points: String(MAX_POINTS) });
  if (rank != null) params.set("rank", String(rank));
  if (zoom) {
    params.set("start", String(Math.floor(zoom[0])));
    params.set("end", String(Math.ceil(zoom[1])));
  }
  return `api/scalars?${params}`;
}

async function fetchChart(id, onlyRun = null) {
  const c = state.charts.get(id);
  if (!c) return;
  if (c.chart.kind === "heatmap") return fetchHeatmap(id, c, onlyRun);
  const zoom = c.zoom;
  const jobs = [];
  for (const run of selectedRuns()) {
    if (onlyRun && run.name !== onlyRun) continue;
    for (const tag of c.spec.tags) if (run.tags.includes(tag)) jobs.push([run, tag]);
  }
  await Promise.all(jobs.map(async ([run, tag]) => {
    try {
      const drawn = await fetchDrawn(run, tag, zoom);
      if (c.zoom === zoom && drawn.mode === modeOf(run)) c.data.set(`${run.name}\t${tag}`, drawn);
    } catch (err) {
      console.warn(`msmon: ${run.name} ${tag}: ${err.message}`);
    }
  }));
  for (const key of [...c.data.keys()]) if (!state.selected.has(key.split("\t")[0])) c.data.delete(key);
  draw(id);
}

// A heatmap shows one run (the first selected that has its tags; its lowest rank): the
// selected statistic's series of every module and their nonfinite counts.
function heatRun(c) {
  return selectedRuns().find((r) => c.spec.tags.some((t) => r.tags.includes(t))) || null;
}

async function fetchHeatmap(id, c, onlyRun) {
  const run = heatRun(c);
  if (!run || (onlyRun && run.name !== onlyRun)) return;
  const tags = c.chart.wanted().filter((t) => run.tags.includes(t));
  await Promise.all(tags.map(async (tag) => {
    try {
      const s = await limited(() => getJSON(scalarsURL(run.name, tag, null)));
      c.data.set(`${run.name}\t${tag}`, { mode: "single", series: s });
    } catch (err) {
      console.warn(`msmon: ${run.name} ${tag}: ${err.message}`);
    }
  }));
  draw(id);
}

function drawHeatmap(c) {
  const run = heatRun(c);
  const chart = c.chart;
  const get = (tag) => (run ? c.data.get(`${run.name}\t${tag}`)?.series : null);
  const rows = (c.spec.rows || []).map((row) => {
    const s = get(chart.tagOf(row));
    const count = chart.stat === MSMON_HEAT_COUNT ? null : get(chart.tagOf(row, MSMON_HEAT_COUNT));
    const flagged = count ? count.steps.filter((_, j) => count.values[j] > 0) : [];
    if (!s) return { row, xs: [], ys: [], nonfinite: [], flagged };
    return { row, xs: s.steps, ys: s.values, flagged,
      nonfinite: s.nonfinite.steps.map((step, j) => [step, s.nonfinite.kinds[j]]) };
  });
  // the run's alerts on its modules (the heatmap keeps those whose tag is one of them)
  const alerts = (run ? state.alerts.get(run.name) || [] : []).map((a) => ({
    step: a.since_step ?? a.step, severity: a.severity, tag: alertTag(a) }));
  chart.set(rows, { scale: state.yscale, width: chartWidth(chart), alerts });
  chart.setTitleNote(run && state.selected.size > 1 ? run.name : "");
}

// What one run contributes to a chart: its series, one per rank, or the ranks merged.
async function fetchDrawn(run, tag, zoom) {
  const mode = modeOf(run);
  if (mode !== "lines") {
    const rank = mode === "band" ? "all" : null;
    const series = await limited(() => getJSON(scalarsURL(run.name, tag, zoom, rank)));
    if (mode === "band" && !zoom) noteOutliers(run, tag, series);
    return { mode, series };
  }
  const parts = await Promise.all(run.ranks.map((k) =>
    limited(() => getJSON(scalarsURL(run.name, tag, zoom, k))).then((s) => [k, s], () => null)));
  return { mode, ranks: parts.filter(Boolean) };  // a rank without this tag is left out
}

// The API's {steps, values, nonfinite: {steps, kinds}} as one chart series.
function line(label, tag, s, color, extra = {}) {
  return { label, tag, color, xs: s.steps, ys: s.values,
    nonfinite: s.nonfinite.steps.map((step, i) => [step, s.nonfinite.kinds[i]]), ...extra };
}

// A tag's colour: alone, the panel's colour for that line; beside other runs, the run's
// colour for the chart's first tag, then shades of it.
function tagColor(run, spec, tag, alone) {
  const i = spec.tags.indexOf(tag);
  if (alone) return MSMON_COLORS[Math.max(0, i) % MSMON_COLORS.length];
  return i <= 0 ? colorOf(run) : rankColor(run, i, spec.tags.length + 1);
}

function draw(id) {
  const c = state.charts.get(id);
  if (!c) return;
  if (c.chart.kind === "heatmap") { drawHeatmap(c); return; }
  const series = [];
  let raw = true;
  let points = 0;
  const runs = selectedRuns();
  const many = c.spec.tags.length > 1;
  for (const run of runs) {
    for (const tag of c.spec.tags) {
      const drawn = c.data.get(`${run.name}\t${tag}`);
      if (!drawn) continue;
      // the plan's label: the tag, or an optimizer's name for its own series
      const label = (c.spec.labels || c.spec.tags)[c.spec.tags.indexOf(tag)];
      const name = many ? (runs.length > 1 ? `${run.name} ${label}` : label) : run.name;
      const parts = drawn.mode === "lines" ? drawn.ranks : [[null, drawn.series]];
      for (const [i, [k, s]] of parts.entries()) {
        raw = raw && s.raw;
        points += s.steps.length;
        if (drawn.mode === "lines") {
          series.push(line(`${name} rank ${k}`, tag, s, rankColor(run.name, i, parts.length)));
        } else if (drawn.mode === "band") {
          // the ranks' min..max shaded, their median (the mean where ranks' steps differ),
          // and the ranks far from the others as lines of their own
          const color = tagColor(run.name, c.spec, tag, runs.length === 1);
          const n = s.rank_count.length ? Math.max(...s.rank_count) : run.ranks.length;
          series.push(line(`${name} min`, tag, { ...s, values: s.band_min }, null, { band: "lo" }));
          series.push(line(`${name} max`, tag, { ...s, values: s.band_max }, null, { band: "hi" }));
          if (s.median) {
            series.push(line(`${name} median of ${n} ranks`, tag, { ...s, values: s.median }, color));
          } else {
            series.push(line(`${name} mean of ${n} ranks`, tag, s, color));
          }
          (s.outliers || []).forEach((o, i) => {
            series.push(line(`${name} rank ${o.rank}`, tag, { ...s, values: o.values },
              MSMON_COLORS[(i + 3) % MSMON_COLORS.length], { width: 1 }));
          });
        } else {
          series.push(line(name, tag, s, tagColor(run.name, c.spec, tag, runs.length === 1)));
        }
      }
    }
  }
  const alerts = [];
  for (const run of runs) {
    const ranked = isRanked(run);
    for (const a of state.alerts.get(run.name) || []) {
      const tag = alertTag(a);
      alerts.push({ step: a.since_step ?? a.step, severity: a.severity, tag,
        label: ranked && a.rank != null ? `rank ${a.rank}` : "" });
    }
  }
  const marks = [];
  for (const run of runs) {
    for (const i of state.interventions.get(run.name) || []) {
      const m = interventionMark(i);
      if (m) marks.push(runs.length > 1 ? { ...m, text: `${run.name}: ${m.text}` } : m);
    }
  }
  c.chart.set(series, { smooth: state.smoothing, scale: state.yscale, alerts, marks,
    fit: true, width: chartWidth(c.chart) });
  c.chart.setTitleNote(points === 0 ? "" : raw ? "raw points" : "min/max per bucket");
  c.chart.el.dataset.raw = String(raw && points > 0);
}

// A box zoom asks the server for the visible range (raw once few enough points are in
// it); a double-click asks for the whole run again.
function onZoom(id, range) {
  const c = state.charts.get(id);
  if (!c) return;
  c.zoom = range;
  fetchChart(id);
}

function resetZoom() {
  for (const [id, c] of state.charts) {
    c.zoom = null;
    c.chart.unzoom();
    fetchChart(id);
  }
}

// --- alerts, snapshots, interventions and checkpoints ---------------------------------------------------------------

async function loadSide(run) {
  try {
    const q = new URLSearchParams({ run });
    const [alerts, snaps, interventions, checkpoints] = await Promise.all([
      getJSON(`api/alerts?${q}`),
      getJSON(`api/snapshots?${q}`),
      getJSON(`api/interventions?${q}`),
      getJSON(`api/checkpoints?${q}`),
    ]);
    state.alerts.set(run, alerts);
    state.snapshots.set(run, snaps);
    state.interventions.set(run, interventions);
    state.checkpoints.set(run, checkpoints);
  } catch (err) {
    console.warn(`msmon: ${run}: ${err.message}`);
  }
}

function renderSide() {
  const alertsBody = document.querySelector("#alerts tbody");
  alertsBody.replaceChildren();
  const snapsBody = document.querySelector("#snapshots tbody");
  snapsBody.replaceChildren();
  const actsBody = document.querySelector("#interventions tbody");
  actsBody.replaceChildren();
  const ckptBody = document.querySelector("#checkpoints tbody");
  ckptBody.replaceChildren();
  let nAlerts = 0;
  let nSnaps = 0;
  let nActs = 0;
  let nCkpts = 0;
  let nActSnaps = 0;
  const actSnaps = document.getElementById("act-snapshots");
  actSnaps.replaceChildren();
  for (const run of selectedRuns()) {
    for (const i of state.interventions.get(run.name) || []) {
      nActs += 1;
      actsBody.append(el("tr", { "data-what": i.what || "", "data-ok": String(!!i.ok) },
        el("td", { text: run.name }), el("td", { class: "num", text: i.rank == null ? "-" : String(i.rank) }),
        el("td", { class: "num", text: fmt(i.step) }), el("td", { text: i.who || "-" }),
        el("td", { text: i.label || i.what || "-" }), el("td", { text: i.ok ? "done" : "refused" }),
        el("td", { text: i.message || "" })));
    }
    for (const k of state.checkpoints.get(run.name) || []) {
      nCkpts += 1;
      const file = String(k.path || "").split("/").slice(-2).join("/");
      ckptBody.append(el("tr", { "data-step": String(k.step) },
        el("td", { text: run.name }), el("td", { class: "num", text: k.rank == null ? "-" : String(k.rank) }),
        el("td", { class: "num", text: fmt(k.step) }),
        el("td", { class: "num", text: `${(k.bytes / 1e6).toPrecision(3)} MB` }),
        el("td", { text: file, title: k.path || "" })));
    }
    for (const a of state.alerts.get(run.name) || []) {
      nAlerts += 1;
      alertsBody.append(el("tr", { "data-kind": a.kind || "", "data-rank": a.rank ?? "" },
        el("td", { text: run.name }), el("td", { class: "num", text: a.rank == null ? "-" : String(a.rank) }),
        el("td", { class: "num", text: fmt(a.step) }),
        el("td", { class: "num", text: fmt(a.since_step) }),
        el("td", { class: `severity-${a.severity}`, text: a.severity || "-" }),
        el("td", { text: a.kind || "-" }), el("td", { text: a.message || "" })));
    }
    const acts = (state.snapshots.get(run.name) || []).filter((s) => s.kind === "activations");
    if (acts.length) {
      nActSnaps += acts.length;
      actSnaps.append(activationTable(acts, state.selected.size > 1 ? run.name : null));
    }
    for (const s of state.snapshots.get(run.name) || []) {
      if (s.kind === "activations") continue;
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
  document.getElementById("act-snapshots-section").hidden = nActSnaps === 0;
  document.getElementById("interventions-section").hidden = nActs === 0;
  document.getElementById("checkpoints-section").hidden = nCkpts === 0;
}

// --- refresh ------------------------------------------------------------------------------

const relisted = new Set();
async function refreshAll() {
  await loadPlan();
  syncCharts();
  const runs = selectedRuns().map((r) => r.name);
  // Alerts and snapshots load beside the charts (a big job's cross-rank alerts come later
  // than its charts); once here, they are drawn onto whatever the charts hold.
  const side = Promise.all(runs.map(loadSide)).then(() => {
    renderSide();
    if (selectedRuns().some(isRanked)) renderRuns();  // rank_stopped alerts flag their ranks
    for (const [id, c] of state.charts) if (c.data.size) draw(id);
  });
  await Promise.all([side, ...[...state.charts.keys()].map((id) => fetchChart(id))]);
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
      const ids = [...state.charts].filter(([, c]) => !c.zoom).map(([id]) => id);
      await Promise.all(ids.map((id) => fetchChart(id, run)));
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
    try {
      await loadRuns();
    } catch (err) {  // the network went: the stream's reconnect brings what was missed
      console.warn(`msmon: listing runs: ${err.message}`);
      return;
    }
    const added = [...state.charts.keys()].filter((id) => !before.has(id));
    await Promise.all(added.map((id) => fetchChart(id)));
  }, 300);
}

// The stream only says what changed (the points come from api/scalars, whole series, so
// a refetch never doubles a point). A lost connection is retried by the browser, which
// sends the id of the last event it saw: the server replays what happened meanwhile
// (hello.resumed), or, when it cannot (restarted, or too much happened), says so and the
// page reloads what it shows rather than keep a gap.
let streamHellos = 0;
function connect() {
  const live = document.getElementById("live");
  const source = new EventSource("api/stream");
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  source.addEventListener("error", () => { live.textContent = "offline"; live.className = "live off"; });
  source.addEventListener("hello", (ev) => {
    const hello = JSON.parse(ev.data);
    document.getElementById("base").textContent = hello.base;
    streamHellos += 1;
    live.dataset.hellos = String(streamHellos);
    live.dataset.resumed = String(hello.resumed);
    if (streamHellos > 1 && !hello.resumed) {
      loadRuns().then(() => refreshAll())
        .catch((err) => console.warn(`msmon: reloading after a gap: ${err.message}`));
    }
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
    for (const id of state.charts.keys()) draw(id);
  });
}

function init() {
  document.getElementById("yscale").addEventListener("change", (ev) => {
    state.yscale = ev.target.value;
    for (const id of state.charts.keys()) draw(id);
  });
  const smooth = document.getElementById("smooth");
  smooth.addEventListener("input", () => {
    state.smoothing = Number(smooth.value);
    document.getElementById("smooth-value").textContent = state.smoothing.toFixed(2);
    for (const id of state.charts.keys()) draw(id);
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
  getJSON("api/info").then((info) => {
    state.token = info.control_token;
    state.commands = info.commands || [];
    document.getElementById("controls").replaceChildren(); // rows built before: rebuilt
    renderControls();
  })
    .catch((err) => console.error(`msmon: ${err.message}`));
  loadRuns().catch((err) => console.error(`msmon: ${err.message}`));
}

window.msmon = { state, ema };
init();
