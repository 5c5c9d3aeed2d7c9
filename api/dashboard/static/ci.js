// The CI page: per-commit verdicts of one repository (GET /ci/commits) and the failure rate
// across those commits, oldest to newest, drawn as steps so a regression shows as one.
"use strict";

const VERDICT_COLORS = { pass: "#2e7d32", fail: "#c62828" };

function verdictColor(v) { return VERDICT_COLORS[v] || "#90a4ae"; }

function commitRow(c) {
  return el("tr", { "data-commit": c.commit_sha },
    el("td", {}, el("code", { title: c.commit_sha }, c.commit_sha.slice(0, 10))),
    el("td", {}, c.ref || "–"),
    el("td", {}, c.event || "–"),
    el("td", {}, c.verdict ? badge(c.verdict) : el("span", { class: "muted" }, "pending")),
    el("td", {}, c.state ? badge(c.state) : "–"),
    el("td", {}, c.configs ?? "–"),
    el("td", {}, c.failures ?? "–"),
    el("td", {}, fmtRate(c.failure_rate)),
    el("td", {}, fmtTime(c.finished_at)),
    el("td", {}, c.sweep_id ? el("a", { href: `/dashboard/sweeps/${c.sweep_id}` }, `#${c.sweep_id}`) : "–"));
}

function renderChart(commits) {
  const ordered = [...commits].reverse();
  const trace = {
    type: "scatter", mode: "lines+markers", line: { shape: "hv", color: "#37474f" },
    x: ordered.map((c) => c.commit_sha.slice(0, 8)), y: ordered.map((c) => c.failure_rate),
    marker: { size: 10, color: ordered.map((c) => verdictColor(c.verdict)) },
    customdata: ordered.map((c) => [c.ref || "", c.verdict || "pending", c.failures ?? 0, c.configs ?? 0]),
    hovertemplate: "%{x} %{customdata[0]}<br>%{customdata[1]}: %{customdata[2]} of %{customdata[3]} failed<br>rate %{y:.2%}<extra></extra>",
  };
  const layout = { margin: { t: 10, r: 10, b: 60, l: 60 }, xaxis: { type: "category", title: { text: "commit" } },
                   yaxis: { title: { text: "failure rate" }, tickformat: ".1%", rangemode: "tozero" } };
  if (!ordered.length) layout.annotations = [{ text: "no CI sweeps", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }];
  return Plotly.react("rate-chart", [trace], layout, PLOT_CONFIG);
}

async function load(repository) {
  const tbody = document.querySelector("#commits tbody");
  if (!repository) {
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: 10, class: "muted" }, "name a repository")));
    return renderChart([]);
  }
  let commits;
  try {
    commits = await api("/ci/commits", new URLSearchParams({ repository }));
  } catch (err) {
    showProblems(err);
    tbody.replaceChildren();
    return renderChart([]);
  }
  showProblems(null);
  tbody.replaceChildren(...(commits.length ? commits.map(commitRow)
    : [el("tr", {}, el("td", { colspan: 10, class: "muted" }, "no CI sweeps for this repository"))]));
  await renderChart(commits);
  document.getElementById("rate-chart").dataset.points = String(commits.length);
  // Verdicts of commits still running fill in as their sweeps finish.
  if (commits.some((c) => ACTIVE.has(c.state))) setTimeout(() => load(repository), 5000);
}

function repositoryRow(r) {
  return el("tr", { "data-repository": r.repository },
    el("td", {}, el("a", { href: `?repository=${encodeURIComponent(r.repository)}`, onclick: (e) => { e.preventDefault(); show(r.repository); } },
      r.repository)),
    el("td", {}, r.sweeps),
    el("td", {}, r.last_commit_sha ? el("code", { title: r.last_commit_sha }, r.last_commit_sha.slice(0, 10)) : "–"),
    el("td", {}, r.last_ref || "–"),
    el("td", {}, badge(r.last_verdict)),
    el("td", {}, fmtTime(r.last_created_at)));
}

async function loadRepositories() {
  const tbody = document.querySelector("#repositories tbody");
  try {
    const repos = await api("/ci/repositories");
    tbody.replaceChildren(...(repos.length ? repos.map(repositoryRow)
      : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no repository has sent a CI event yet"))]));
    return repos;
  } catch (err) {
    showProblems(err);
    return [];
  }
}

const form = document.getElementById("repo-form");

function show(repository) {
  form.repository.value = repository;
  history.replaceState(null, "", repository ? `?repository=${encodeURIComponent(repository)}` : location.pathname);
  for (const tr of document.querySelectorAll("#repositories tr[data-repository]")) {
    tr.classList.toggle("selected", tr.dataset.repository === repository);
  }
  return load(repository);
}

form.addEventListener("submit", (e) => {
  e.preventDefault();
  show(form.repository.value.trim());
});
loadRepositories().then((repos) => {
  // With one repository there is nothing to choose: show it.
  const given = form.repository.value.trim();
  show(given || (repos.length === 1 ? repos[0].repository : ""));
});
