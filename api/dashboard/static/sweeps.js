// The sweeps page: GET /sweeps, re-read every few seconds while any sweep on it is active.
"use strict";

const PAGE = 50;
const state = { offset: 0, status: "", label: "" };
let timer = null;

function commitCell(s) {
  const sha = s.commit_sha;  // present on CI sweeps
  return el("td", {},
    s.label ? el("div", {}, s.label) : el("div", { class: "muted" }, "no label"),
    sha ? el("code", { title: sha }, sha.slice(0, 10)) : null,
    s.repository ? el("div", { class: "muted" }, s.repository + (s.ref ? ` @ ${s.ref}` : "")) : null,
    s.submitted_by ? el("div", { class: "muted by" }, `by ${s.submitted_by}`) : null);
}

function outcomesCell(outcomes) {
  return el("td", { class: "counts" }, OUTCOMES.filter((o) => outcomes[o]).map((o) =>
    el("span", { class: "count", style: `border-color:${OUTCOME_COLORS[o]}` }, `${o} ${outcomes[o]}`)));
}

function reasonsCell(filtered) {
  const entries = Object.entries(filtered).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
  if (!entries.length) return el("td", { class: "muted" }, "none");
  return el("td", { class: "counts" }, entries.map(([r, n]) => el("span", { class: "count" }, `${r} ${n}`)));
}

function row(s) {
  return el("tr", { "data-sweep": s.id, "data-status": s.status },
    el("td", {}, el("a", { href: `/dashboard/sweeps/${s.id}` }, `#${s.id}`), el("div", { class: "muted" }, s.backend),
      s.kernel !== "attnsweep" ? el("div", { class: "kernel" }, s.kernel_name || s.kernel) : ""),
    commitCell(s),
    el("td", {}, badge(s.status)),
    el("td", {}, progress(s.configs_done, s.configs_total)),
    outcomesCell(s.outcomes),
    el("td", { class: "bugs" }, s.bugs === null || s.bugs === undefined ? el("span", { class: "muted" }, "–")
      : el("a", { href: `/dashboard/sweeps/${s.id}#clusters-panel` }, `${s.bugs} bug${s.bugs === 1 ? "" : "s"}`)),
    el("td", { class: "rate" }, fmtRate(failureRate(s.outcomes, FAILING))),
    reasonsCell(s.filtered),
    el("td", {}, fmtTime(s.started_at)),
    el("td", {}, fmtDuration(s.started_at, s.finished_at)));
}

async function load() {
  const params = new URLSearchParams({ offset: state.offset, limit: PAGE });
  if (state.status) params.set("status", state.status);
  if (state.label) params.set("label", state.label);
  try {
    const body = await api("/sweeps", params);
    showProblems(null);
    document.querySelector("#sweeps tbody").replaceChildren(
      ...(body.data.length ? body.data.map(row) : [el("tr", {}, el("td", { colspan: 10, class: "muted" }, "no sweeps"))]));
    document.getElementById("range").textContent =
      body.count ? `${state.offset + 1}–${state.offset + body.data.length} of ${body.count}` : "";
    document.getElementById("prev").disabled = state.offset === 0;
    document.getElementById("next").disabled = state.offset + body.data.length >= body.count;
    const active = body.data.some((s) => ACTIVE.has(s.status));
    document.getElementById("refresh-note").textContent = active ? "refreshing every 3 s while sweeps run" : "";
    clearTimeout(timer);
    if (active) timer = setTimeout(load, 3000);
  } catch (err) {
    showProblems(err);
  }
}

document.getElementById("sweep-filters").addEventListener("submit", (e) => {
  e.preventDefault();
  const form = new FormData(e.target);
  Object.assign(state, { offset: 0, status: form.get("status"), label: form.get("label").trim() });
  load();
});
document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); load(); });
document.getElementById("next").addEventListener("click", () => { state.offset += PAGE; load(); });
load();
