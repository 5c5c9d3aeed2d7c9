// One sweep: its counts as charts, a failure-rate heatmap over two chosen fields, its failures as
// bugs (the clusters its triage stored) and the failure table. Everything is read from the
// public endpoints; the URL keeps the filters, sort and axes, so a view can be shared as a link.
"use strict";

const PAGE = 50;
const PAGE_KEYS = new Set(["sort", "offset", "hx", "hy"]);
// Filters that select by result rather than by config: the heatmap would show 100% under them.
const RESULT_FILTERS = new Set(["outcome", "gate", "threshold_reason", "not_applicable_reason", "bug"]);
const base = `/sweeps/${SWEEP_ID}`;
const state = { filters: new Map(), sort: "seq", offset: 0, hx: "split_kv", hy: "dtype" };
let sweep = null;
let shownDone = -1;
let pollTimer = null;
let shown = { hx: null, hy: null, cells: [] };  // the heatmap as drawn, for its click handler
// Answers may arrive out of order when controls change quickly: only the latest request renders.
const latest = { heatmap: 0, failures: 0 };

function readUrl() {
  for (const [k, v] of new URLSearchParams(location.search)) {
    if (k === "offset") state.offset = Math.max(0, parseInt(v, 10) || 0);
    else if (PAGE_KEYS.has(k)) state[k] = v;
    else state.filters.set(k, v);
  }
}

function writeUrl() {
  const params = filterParams(state.filters);
  if (state.sort !== "seq") params.set("sort", state.sort);
  if (state.offset) params.set("offset", state.offset);
  params.set("hx", state.hx);
  params.set("hy", state.hy);
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

function filterParams(filters) {
  const params = new URLSearchParams();
  for (const [k, v] of filters) params.set(k, v);
  return params;
}

// --- the sweep: header, progress, charts -----------------------------------------------------
function renderSweep(s) {
  document.getElementById("label").textContent = s.label || "";
  const status = document.getElementById("status");
  status.textContent = s.status;
  status.className = `badge ${s.status}`;
  // A sweep run with defect switches compiled in is a demonstration, not a verdict on the kernels.
  const defects = (s.request && s.request.defects) || [];
  const defectsBadge = document.getElementById("defects");
  defectsBadge.hidden = !defects.length;
  defectsBadge.textContent = defects.length ? `defects compiled in: ${defects.join(", ")}` : "";
  const pct = s.configs_total ? (100 * s.configs_done) / s.configs_total : 0;
  document.getElementById("progress-bar").style.width = `${pct.toFixed(1)}%`;
  document.getElementById("progress-text").textContent = `${s.configs_done} / ${s.configs_total} configs done`;
  const failures = FAILING.reduce((n, o) => n + (s.outcomes[o] || 0), 0);
  const applicable = s.configs_done - (s.outcomes.not_applicable || 0);
  const facts = [
    ["failures", `${failures} (${fmtRate(applicable ? failures / applicable : null)} of ${applicable} applicable)`],
    ["backend", s.backend + (s.device ? ` on ${s.device}` : "")],
    ["commit", s.commit_sha ? `${s.commit_sha.slice(0, 12)}${s.ref ? " " + s.ref : ""}` : null],
    ["repository", s.repository || null],
    ["seed", s.seed],
    ["draws", s.draws],
    ["started", fmtTime(s.started_at)],
    ["duration", fmtDuration(s.started_at, s.finished_at)],
    ["throughput", s.throughput === null ? null : `${fmtNumber(s.throughput)} configs/s`],
    ["re-run of", s.rerun_of],
    ["submitted by", s.submitted_by],
    ["error", s.error],
  ].filter(([, v]) => v !== null && v !== undefined);
  document.getElementById("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
  renderCharts(s);
}

function renderCharts(s) {
  Plotly.react("outcomes-chart", [{
    type: "bar", x: OUTCOMES, y: OUTCOMES.map((o) => s.outcomes[o] || 0), text: OUTCOMES.map((o) => String(s.outcomes[o] || 0)),
    textposition: "outside", cliponaxis: false, marker: { color: OUTCOMES.map((o) => OUTCOME_COLORS[o]) },
    hovertemplate: "%{x}: %{y}<extra></extra>",
  }], { margin: { t: 20, r: 10, b: 40, l: 50 }, yaxis: { title: { text: "configs" } } }, PLOT_CONFIG);
  const filtered = Object.entries(s.filtered).filter(([, n]) => n > 0).sort((a, b) => a[1] - b[1]);
  const na = Object.entries(s.not_applicable_reasons).sort((a, b) => a[1] - b[1]);
  const traces = [
    { name: "filtered before running", entries: filtered, color: "#546e7a" },
    { name: "not applicable", entries: na, color: OUTCOME_COLORS.not_applicable },
  ].filter((t) => t.entries.length).map((t) => ({
    type: "bar", orientation: "h", name: t.name, y: t.entries.map(([r]) => r), x: t.entries.map(([, n]) => n),
    text: t.entries.map(([, n]) => String(n)), textposition: "auto", marker: { color: t.color },
    hovertemplate: "%{y}: %{x}<extra>" + t.name + "</extra>",
  }));
  const layout = { margin: { t: 30, r: 10, b: 30, l: 170 }, barmode: "group",
                   legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" } };
  if (!traces.length) layout.annotations = [{ text: "nothing filtered", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }];
  Plotly.react("reasons-chart", traces, layout, PLOT_CONFIG);
}

async function loadSweep() {
  clearTimeout(pollTimer);
  try {
    sweep = await api(base);
  } catch (err) {
    showProblems(err);
    return;
  }
  renderSweep(sweep);
  loadClusters();
  if (sweep.configs_done !== shownDone) {
    shownDone = sweep.configs_done;
    loadHeatmap();
    loadFailures();
  }
  // Progress refreshes while the sweep runs; the charts, heatmap and table follow new results.
  if (ACTIVE.has(sweep.status)) pollTimer = setTimeout(loadSweep, 2000);
}

// --- clusters (the sweep's triage) ------------------------------------------------------------
let clustersTimer = null;
let clustersShown = null;  // the status last drawn: a finished triage is drawn once

const TRIAGE_TEXT = {
  pending: "triage pending: the failures are clustered, shrunk and classified once the sweep ends",
  running: "triage running on a worker",
  none: "no triage for this sweep",
};

function signatureLabel(s) { return `${s.outcome}/${s.gate || "-"}/${s.location}`; }

// The CI bisection of the cluster, when a push started one: its state until it names the commit.
function firstBad(c) {
  if (c.first_bad_commit) return el("code", {}, c.first_bad_commit);
  const b = c.bisection;
  if (!b) return "–";
  const state = { queued: "bisecting", running: "bisecting", done: "ambiguous", error: "bisection failed" }[b.status];
  return el("a", { href: `/bisect/${b.id}` }, state || b.status);
}

// Every symptom of the bug, most frequent first: the families a bug in shared code spans show here.
function symptoms(c) {
  return Object.entries(c.signatures || {}).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))
    .map(([label, n]) => `${label} ${n}`).join(", ");
}

function clusterCard(c, i) {
  const kind = c.classification ? c.classification.kind : null;
  const smallest = c.minimal_config || c.example_config;
  const copy = copyButton({ id: `cluster-${i + 1}`, reproducer: c.reproducer });
  copy.classList.add("copy-cluster");
  return el("article", { class: "cluster", "data-cluster": i + 1, id: `bug-${i + 1}` },
    el("h3", {}, el("span", { class: "bug-number" }, `bug ${i + 1}`), " · ",
      el("b", { class: "cluster-size" }, `${c.size} failing`), " ", badge(c.signature.outcome), " ",
      el("code", {}, signatureLabel(c.signature)), " ",
      el("a", { class: "bug-filter", href: "#failures-section", onclick: () => showBug(i + 1) }, "its failures")),
    el("p", { class: "explanation" }, c.explanation.summary),
    el("dl", { class: "cluster-facts" },
      el("dt", {}, "symptoms"), el("dd", { class: "signatures" }, symptoms(c)),
      el("dt", {}, "classification"), el("dd", { class: "classification" }, kind || "–"),
      el("dt", {}, "first bad commit"), el("dd", { class: "first-bad" }, firstBad(c)),
      el("dt", {}, c.minimal_config ? "minimal config" : "smallest member"),
      el("dd", {}, el("code", { class: "minimal-config" }, JSON.stringify(smallest, (k, v) => (v === null ? undefined : v))))),
    c.reproducer ? el("div", { class: "cluster-reproducer" }, copy, el("pre", { class: "reproducer" }, c.reproducer)) : null);
}

// The failure table filtered to one bug (GET /sweeps/{id}/failures?bug=N).
function showBug(n) {
  state.filters.set("bug", String(n));
  state.offset = 0;
  refresh();
}

async function loadClusters() {
  clearTimeout(clustersTimer);
  if (clustersShown === "done" || clustersShown === "failed" || (clustersShown === "none" && !ACTIVE.has(sweep.status))) return;
  let report;
  try {
    report = await api(`${base}/clusters`);
  } catch (err) {
    showProblems(err);
    return;
  }
  const stateLine = document.getElementById("triage-state");
  const box = document.getElementById("clusters");
  const summary = document.getElementById("clusters-summary");
  document.getElementById("clusters-panel").dataset.status = report.status;
  if (report.status === "done") {
    const failing = report.clusters.reduce((n, c) => n + c.size, 0);
    const bugs = report.clusters.length;
    summary.textContent = bugs ? `${bugs} bug${bugs === 1 ? "" : "s"} in ${failing} failing configs` : "no failures";
    stateLine.textContent = "";
    stateLine.hidden = true;
    box.replaceChildren(...report.clusters.map(clusterCard));
    if (clustersShown !== null && clustersShown !== "done") loadFailures();  // rows gain their bug numbers
  } else {
    summary.textContent = "";
    stateLine.hidden = false;
    stateLine.textContent = report.status === "failed" ? `triage failed: ${report.error || "no reason stored"}`
      : TRIAGE_TEXT[report.status];
    box.replaceChildren();
  }
  clustersShown = report.status;
  // A triage follows the sweep's end on a worker: keep asking while it is pending or running.
  if (report.status === "pending" || report.status === "running") clustersTimer = setTimeout(loadClusters, 3000);
}

// --- heatmap ---------------------------------------------------------------------------------
function heatmapFilters() {
  const axes = new Set([state.hx, state.hy].map((f) => f.replace(/_bucket$/, "")));
  return new Map([...state.filters].filter(([k]) => !RESULT_FILTERS.has(k) && !axes.has(k)));
}

async function loadHeatmap() {
  const params = filterParams(heatmapFilters());
  params.append("by", state.hy);
  params.append("by", state.hx);
  document.getElementById("json-rates").href = `${base}/failure-rates?${params}`;
  const ticket = ++latest.heatmap;
  let body;
  try {
    body = await api(`${base}/failure-rates`, params);
  } catch (err) {
    if (ticket === latest.heatmap) showProblems(err);
    return;
  }
  if (ticket !== latest.heatmap) return;
  const [hy, hx] = body.by;
  const cells = body.cells;
  shown = { hx, hy, cells };
  const xs = body.axes[hx], ys = body.axes[hy];
  const labelOf = (field, value) => {
    const cell = cells.find((c) => c.key[field] === value);
    return cell ? cell.label[field] : String(value);
  };
  const xl = xs.map((v) => labelOf(hx, v)), yl = ys.map((v) => labelOf(hy, v));
  const at = (y, x) => cells.find((c) => c.key[hy] === y && c.key[hx] === x);
  const z = ys.map((y) => xs.map((x) => { const c = at(y, x); return c ? c.failure_rate : null; }));
  const text = ys.map((y) => xs.map((x) => {
    const c = at(y, x);
    if (!c) return "";
    const applicable = c.runs - c.outcomes.not_applicable;
    return applicable ? `${c.failures}/${applicable}` : "n/a";
  }));
  const trace = {
    type: "heatmap", x: xl, y: yl, z, text, texttemplate: "%{text}", zmin: 0, zmax: 1, xgap: 2, ygap: 2,
    // Any failure must stand out from a clean cell, so the scale leaves green at the first step.
    colorscale: [[0, "#c8e6c9"], [1e-6, "#ffe0b2"], [0.25, "#fb8c00"], [1, "#b71c1c"]],
    // Plotly's colour bar cannot show the zero-failure green, a sliver at its very bottom: the
    // legend under the chart (#heatmap-legend) names every colour drawn, green first.
    showscale: false, hoverongaps: false,
    hovertemplate: `${hy}=%{y}<br>${hx}=%{x}<br>failure rate %{z:.1%}<br>failures/applicable %{text}<extra></extra>`,
  };
  const layout = {
    margin: { t: 10, r: 10, b: 60, l: 110 },
    xaxis: { type: "category", title: { text: hx } }, yaxis: { type: "category", title: { text: hy }, autorange: "reversed" },
    height: Math.max(260, 90 + 36 * ys.length),
  };
  if (!cells.length) layout.annotations = [{ text: "no finished configs", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }];
  const div = document.getElementById("heatmap");
  await Plotly.react(div, [trace], layout, PLOT_CONFIG);
  div.dataset.cells = String(cells.length);
  if (!div.dataset.bound) {
    div.dataset.bound = "1";
    div.on("plotly_click", (ev) => {
      const p = ev.points[0];
      const cell = shown.cells.find((c) => c.label[shown.hx] === p.x && c.label[shown.hy] === p.y);
      if (!cell) return;
      for (const [k, v] of Object.entries(cell.filter)) state.filters.set(k, v);
      state.offset = 0;
      refresh();
    });
  }
}

// --- failure table ---------------------------------------------------------------------------
function shape(c) {
  return `g${c.g} q${c.seq_len_q}×k${c.seq_len_k} h${c.num_heads_q}/${c.num_heads_kv} d${c.head_dim_qk}/${c.head_dim_v}`;
}

function mask(c) {
  const parts = [];
  if (c.causal) parts.push(c.prefix_offset ? "causal+prefix" : "causal");
  if (c.current_seq_len) parts.push("kv-cache");
  if (c.with_attn_bias) parts.push("bias");
  return parts.join(", ") || "none";
}

function checkCell(check) {
  if (!check.metric) return el("td", { class: "muted" }, "–");
  return el("td", { class: "check" }, el("code", {}, check.metric), " ",
    el("b", {}, fmtNumber(check.value)), " > ", fmtNumber(check.bound));
}

function copyButton(r) {
  const button = el("button", { class: "copy", type: "button", "data-reproducer": r.id }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await copyText(r.reproducer);
      button.textContent = "Copied";
    } catch (err) {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return button;
}

function failureRow(r) {
  const c = r.config;
  const details = el("details", {}, el("summary", {}, "config"),
    el("pre", {}, JSON.stringify(c, null, 1)),
    r.detail ? el("pre", { class: "detail" }, r.detail) : null,
    el("pre", { class: "reproducer" }, r.reproducer || ""));
  return el("tr", { "data-seq": r.seq, "data-id": r.id },
    el("td", {}, r.seq),
    el("td", { class: "bug" }, r.bug ? el("a", { href: `#bug-${r.bug}` }, String(r.bug)) : "–"),
    el("td", {}, badge(r.outcome)),
    el("td", {}, r.failed_gate || "–"),
    el("td", {}, c.dtype),
    el("td", {}, shape(c)),
    el("td", {}, c.split_kv),
    el("td", {}, mask(c)),
    checkCell(r.check),
    el("td", { class: "why" }, r.check.why),
    el("td", {}, r.reproducer ? copyButton(r) : "–", details));
}

async function loadFailures() {
  const params = filterParams(state.filters);
  document.getElementById("json-failures").href = `${base}/failures?${params}`;
  params.set("sort", state.sort);
  params.set("offset", state.offset);
  params.set("limit", PAGE);
  const tbody = document.querySelector("#failures tbody");
  const ticket = ++latest.failures;
  let body;
  try {
    body = await api(`${base}/failures`, params);
  } catch (err) {
    if (ticket !== latest.failures) return;
    showProblems(err);
    tbody.replaceChildren();
    document.getElementById("failure-count").textContent = "";
    document.getElementById("range").textContent = "";
    document.getElementById("prev").disabled = document.getElementById("next").disabled = true;
    return;
  }
  if (ticket !== latest.failures) return;
  showProblems(null);
  tbody.replaceChildren(...(body.data.length ? body.data.map(failureRow)
    : [el("tr", {}, el("td", { colspan: 11, class: "muted" }, "no failures match"))]));
  document.getElementById("failure-count").textContent = `(${body.count} matching)`;
  document.getElementById("range").textContent = body.count ? `${state.offset + 1}–${state.offset + body.data.length} of ${body.count}` : "";
  document.getElementById("prev").disabled = state.offset === 0;
  document.getElementById("next").disabled = !body.has_more;
  for (const th of document.querySelectorAll("#failures th[data-sort]")) {
    const key = th.dataset.sort;
    th.classList.toggle("sorted", state.sort.replace(/^-/, "") === key);
    th.dataset.dir = state.sort === key ? "asc" : state.sort === `-${key}` ? "desc" : "";
  }
}

function renderChips() {
  const chips = [...state.filters].map(([k, v]) => el("span", { class: "chip", "data-field": k },
    `${k} = ${v}`, el("button", { type: "button", title: `remove ${k}`, onclick: () => {
      state.filters.delete(k);
      state.offset = 0;
      refresh();
    } }, "×")));
  document.getElementById("chips").replaceChildren(...chips);
  const form = document.getElementById("add-filter");
  form.sort.value = state.sort.replace(/^-/, "");
  form.desc.checked = state.sort.startsWith("-");
}

function refresh() {
  writeUrl();
  renderChips();
  loadHeatmap();
  loadFailures();
}

// --- controls --------------------------------------------------------------------------------
function bindControls() {
  const axes = document.getElementById("heatmap-axes");
  axes.hx.value = state.hx;
  axes.hy.value = state.hy;
  axes.addEventListener("change", () => {
    state.hx = axes.hx.value;
    state.hy = axes.hy.value;
    writeUrl();
    loadHeatmap();
  });
  const form = document.getElementById("add-filter");
  const hint = () => { form.value.placeholder = form.field.selectedOptions[0].dataset.hint || "value"; };
  form.field.addEventListener("change", hint);
  hint();
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const value = form.value.value.trim();
    if (!value) return;
    state.filters.set(form.field.value, value);
    form.value.value = "";
    state.offset = 0;
    refresh();
  });
  const resort = () => {
    state.sort = (form.desc.checked ? "-" : "") + form.sort.value;
    state.offset = 0;
    refresh();
  };
  form.sort.addEventListener("change", resort);
  form.desc.addEventListener("change", resort);
  for (const th of document.querySelectorAll("#failures th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.sort = state.sort === key ? `-${key}` : key;
      state.offset = 0;
      refresh();
    });
  }
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); writeUrl(); loadFailures(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += PAGE; writeUrl(); loadFailures(); });
}

// Without axes in the URL, the heatmap opens on the pair of config fields that best separates
// this sweep's failures from its passes (GET /sweeps/{id}/failure-axes).
async function defaultAxes() {
  const given = new URLSearchParams(location.search);
  if (given.has("hx") || given.has("hy")) return;
  try {
    const axes = await api(`${base}/failure-axes`);
    [state.hy, state.hx] = axes.by;
  } catch (err) {
    showProblems(err);
  }
}

(async () => {
  readUrl();
  await defaultAxes();
  bindControls();
  writeUrl();
  renderChips();
  loadSweep();
})();
