// The sweep page's coverage view (GET /sweeps/{id}/coverage, docs/spec.md §6 "Coverage"): for one
// kernel path, every feature value (rows) in every data regime of the sweep (columns), coloured
// covered / rare / never. It follows the page's progress line, so it refreshes with new results
// without a second poll of the sweep.
"use strict";

const COVERAGE_STATES = ["never", "rare", "covered"];  // z = index; null: not reachable on the path
const COVERAGE_COLOURS = { never: "#ef9a9a", rare: "#ffe082", covered: "#a5d6a7" };
const coverage = { body: null, path: null, ticket: 0, progress: null };

async function loadCoverage() {
  const ticket = ++coverage.ticket;
  let body;
  try {
    body = await api(`/sweeps/${SWEEP_ID}/coverage`);
  } catch (err) {
    if (ticket === coverage.ticket) showProblems(err);
    return;
  }
  if (ticket !== coverage.ticket) return;
  coverage.body = body;
  if (!body.paths.includes(coverage.path)) coverage.path = body.paths[0];
  const select = document.querySelector("#coverage-path select[name=path]");
  select.replaceChildren(...body.paths.map((p) => el("option", { value: p }, p)));
  select.value = coverage.path;
  const t = body.totals;
  document.getElementById("coverage-totals").textContent =
    `(${t.covered} covered, ${t.rare} rare, ${t.never} never of ${body.cells_total} cells)`;
  for (const b of document.querySelectorAll("#coverage-legend .rare-below")) b.textContent = String(body.rare_below);
  for (const b of document.querySelectorAll("#coverage-legend .rare-max")) b.textContent = String(body.rare_below - 1);
  renderCoverage();
}

async function renderCoverage() {
  const body = coverage.body, path = coverage.path;
  const rows = Object.entries(body.features).flatMap(([f, values]) => values.map((v) => [f, v]));
  const ys = rows.map(([f, v]) => `${f}=${v}`);
  const xs = body.regimes;
  const byKey = new Map(body.cells.filter((c) => c.path === path).map((c) => [`${c.feature}=${c.value}|${c.regime}`, c]));
  const at = (y, x) => byKey.get(`${y}|${x}`);
  const z = ys.map((y) => xs.map((x) => { const c = at(y, x); return c ? COVERAGE_STATES.indexOf(c.state) : null; }));
  const text = ys.map((y) => xs.map((x) => { const c = at(y, x); return c ? String(c.configs) : ""; }));
  const failing = ys.map((y) => xs.map((x) => { const c = at(y, x); return c ? c.failing : null; }));
  const stateOf = ys.map((y) => xs.map((x) => { const c = at(y, x); return c ? c.state : "not reachable"; }));
  const trace = {
    type: "heatmap", x: xs, y: ys, z, text, customdata: ys.map((_y, i) => xs.map((_x, j) => [stateOf[i][j], failing[i][j]])),
    texttemplate: "%{text}", zmin: 0, zmax: 2, xgap: 2, ygap: 1, showscale: false, hoverongaps: false,
    // Three states, three flat bands: the legend (#coverage-legend) names each colour.
    colorscale: [[0, COVERAGE_COLOURS.never], [1 / 3, COVERAGE_COLOURS.never], [1 / 3, COVERAGE_COLOURS.rare],
                 [2 / 3, COVERAGE_COLOURS.rare], [2 / 3, COVERAGE_COLOURS.covered], [1, COVERAGE_COLOURS.covered]],
    hovertemplate: `path ${path}<br>%{y} in %{x}<br>%{customdata[0]}: %{text} configs, %{customdata[1]} failing<extra></extra>`,
  };
  const layout = {
    margin: { t: 70, r: 10, b: 10, l: 170 },
    xaxis: { type: "category", title: { text: "data regime" }, side: "top" },
    yaxis: { type: "category", autorange: "reversed", tickfont: { size: 11 } },
    height: Math.max(300, 80 + 17 * ys.length),
  };
  const div = document.getElementById("coverage");
  await Plotly.react(div, [trace], layout, PLOT_CONFIG);
  div.dataset.path = path;
  div.dataset.cells = String(byKey.size);
}

(() => {
  document.querySelector("#coverage-path select[name=path]").addEventListener("change", (ev) => {
    coverage.path = ev.target.value;
    if (coverage.body) renderCoverage();
  });
  // sweep.js rewrites the progress line on every poll; a new count of finished configs is a
  // new coverage.
  const progress = document.getElementById("progress-text");
  new MutationObserver(() => {
    if (progress.textContent && progress.textContent !== coverage.progress) {
      coverage.progress = progress.textContent;
      loadCoverage();
    }
  }).observe(progress, { childList: true, characterData: true, subtree: true });
})();
