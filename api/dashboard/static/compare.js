// The kernels page: sweeps of several kernels side by side (GET /compare): outcomes by kernel,
// kernel time as a ratio to the fastest, and the configs that fail on one kernel only.
"use strict";

const OUTCOME_COLORS = { pass: "#2e7d32", fail: "#c62828", nan: "#ad1457", fault: "#6a1b9a", unsafe: "#4527a0",
                         error: "#ef6c00", timeout: "#f9a825", oom: "#795548", not_applicable: "#90a4ae" };

function counts(obj) {
  const entries = Object.entries(obj || {}).filter(([, n]) => n).sort((a, b) => b[1] - a[1]);
  if (!entries.length) return el("td", { class: "muted" }, "none");
  return el("td", { class: "counts" }, entries.map(([k, n]) => el("span", { class: "count" }, `${k} ${n}`)));
}

function ratio(x) { return x == null ? "–" : `${x.toFixed(2)}×`; }

function kernelRow(s) {
  return el("tr", {},
    el("td", {}, el("a", { href: `/dashboard/sweeps/${s.id}` }, `#${s.id}`)),
    el("td", { class: "kernel" }, s.kernel_name), el("td", {}, s.kernel_version || "–"), el("td", {}, s.configs),
    counts(s.outcomes), counts(s.not_applicable), el("td", {}, ratio(s.time_ratio_median)), el("td", {}, s.fastest));
}

function onlyRow(r) {
  return el("tr", {},
    el("td", {}, el("a", { href: `/dashboard/sweeps/${r.sweep_id}` }, `#${r.sweep_id}`)), el("td", {}, r.kernel),
    el("td", {}, badge(r.outcome)), el("td", {}, r.failed_gate || "–"),
    el("td", {}, Object.entries(r.others).map(([id, o]) => `#${id} ${o}`).join(", ")),
    el("td", {}, el("code", {}, JSON.stringify(r.config))));
}

function charts(body) {
  const names = body.sweeps.map((s) => `#${s.id} ${s.kernel_name}`);
  const traces = OUTCOMES.filter((o) => body.sweeps.some((s) => s.outcomes[o])).map((o) => ({
    type: "bar", orientation: "h", name: o, y: names, x: body.sweeps.map((s) => s.outcomes[o] || 0),
    marker: { color: OUTCOME_COLORS[o] || "#607d8b" } }));
  Plotly.react("outcome-chart", traces, { barmode: "stack", margin: { t: 10, r: 10, b: 40, l: 220 },
                                          xaxis: { title: { text: "configs" } } }, PLOT_CONFIG);
  Plotly.react("time-chart", [{
    type: "bar", orientation: "h", y: names, x: body.sweeps.map((s) => s.time_ratio_median),
    text: body.sweeps.map((s) => `${ratio(s.time_ratio_median)} over ${s.timed} configs`), textposition: "auto",
    marker: { color: "#37474f" } }], { margin: { t: 10, r: 10, b: 40, l: 220 },
    xaxis: { title: { text: "median kernel time / fastest" }, rangemode: "tozero" } }, PLOT_CONFIG);
}

async function load(sweeps) {
  const kernels = document.querySelector("#kernels tbody");
  const only = document.querySelector("#only-one tbody");
  if (!sweeps) {
    kernels.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "name two sweeps or more")));
    only.replaceChildren();
    return;
  }
  document.getElementById("json-compare").href = `/compare?sweeps=${encodeURIComponent(sweeps)}`;
  let body;
  try {
    body = await api("/compare", new URLSearchParams({ sweeps }));
  } catch (err) {
    showProblems(err);
    kernels.replaceChildren();
    only.replaceChildren();
    return;
  }
  showProblems(null);
  kernels.replaceChildren(...body.sweeps.map(kernelRow));
  only.replaceChildren(...(body.only_one.length ? body.only_one.map(onlyRow)
    : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "none"))]));
  document.getElementById("only-count").textContent =
    `(${body.only_one_total} of ${body.common} configs in every sweep; ${body.ran_by_all} run by every kernel)`;
  charts(body);
}

document.getElementById("compare-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const sweeps = new FormData(event.target).get("sweeps").trim();
  history.replaceState(null, "", `?sweeps=${encodeURIComponent(sweeps)}`);
  load(sweeps);
});
load(new URLSearchParams(location.search).get("sweeps") || "");
