// Shared by every page: fetch the API, show its field/rule problems, build DOM, format values.
"use strict";

// What the server filled in for this page (base.html's JSON block).
const PAGE_DATA = JSON.parse(document.getElementById("page-data").textContent || "{}");
const SWEEP_ID = PAGE_DATA.sweep_id;
const OUTCOMES = PAGE_DATA.outcomes || [];
const FAILING = PAGE_DATA.failing || [];

class ApiError extends Error {
  constructor(status, problems) {
    super(problems.map((p) => `${p.field}: ${p.rule}`).join("; "));
    this.status = status;
    this.problems = problems;
  }
}

// Where reads need a token (ATTNSWEEP_READ_AUTH), the page asks for one once and keeps it for this
// tab only (sessionStorage), sending it as a bearer token with every request.
const TOKEN_KEY = "attnsweep-token";

function askForToken() {
  const form = document.getElementById("token-form");
  form.hidden = false;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, new FormData(form).get("token").trim());
    location.reload();
  }, { once: true });
}

// A GET with the session's token, accepting `accept`; a 401 or 403 asks for a token.
async function authorizedGet(path, accept) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const resp = await fetch(path, { headers: { accept, ...(token ? { authorization: `Bearer ${token}` } : {}) } });
  if (resp.status === 401 || resp.status === 403) askForToken();
  return resp;
}

async function api(path, params) {
  const qs = params ? "?" + params.toString() : "";
  const resp = await authorizedGet(path + qs, "application/json");
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    const detail = body && body.detail;
    const problems = Array.isArray(detail) ? detail : [{ field: path, rule: detail || `HTTP ${resp.status}` }];
    throw new ApiError(resp.status, problems);
  }
  return body;
}

function showProblems(err) {
  const box = document.getElementById("problems");
  if (!err) { box.hidden = true; box.replaceChildren(); return; }
  const problems = err.problems || [{ field: "page", rule: String(err) }];
  box.replaceChildren(...problems.map((p) => el("div", { class: "problem" }, el("b", {}, p.field), ": " + p.rule)));
  box.hidden = false;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

const OUTCOME_COLORS = {
  pass: "#2e7d32", fail: "#c62828", nan: "#6a1b9a", fault: "#b71c1c", unsafe: "#f9a825", error: "#ef6c00",
  timeout: "#8d6e63", oom: "#ad1457",
  not_applicable: "#90a4ae",
};
const ACTIVE = new Set(["queued", "running"]);

function badge(text, kind) { return el("span", { class: `badge ${kind || text}` }, text); }

function fmtNumber(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "string") return v;  // "nan", "inf", "-inf" as the API writes them
  if (Number.isInteger(v)) return String(v);
  // Four significant digits without padding zeros: 0.07, not 0.07000.
  return Math.abs(v) >= 1e-3 && Math.abs(v) < 1e4 ? String(Number(v.toPrecision(4))) : v.toExponential(3).replace(/\.?0+e/, "e");
}

function fmtRate(r) { return r === null || r === undefined ? "–" : (100 * r).toFixed(r > 0 && r < 0.001 ? 3 : 1) + "%"; }

// ISO 8601 in UTC, to the second: the same text on every reader's screen and in the API's JSON.
function fmtTime(iso) { return iso ? new Date(iso).toISOString().replace(/\.\d{3}Z$/, "Z") : "–"; }

function fmtDuration(startIso, endIso) {
  if (!startIso) return "–";
  const s = Math.max(0, ((endIso ? new Date(endIso) : new Date()) - new Date(startIso)) / 1000);
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

function progress(done, total) {
  const pct = total ? (100 * done) / total : 0;
  return el("div", { class: "progress small", title: `${done} of ${total}` },
    el("div", { style: `width:${pct.toFixed(1)}%` }), el("span", {}, `${done} / ${total}`));
}

// The Clipboard API exists only in secure contexts (https, localhost); elsewhere fall back to
// a selected textarea and execCommand, which every browser still honours on a click.
async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = el("textarea", { style: "position:fixed;left:-9999px" });
  area.value = text;
  document.body.append(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  if (!ok) throw new Error("the browser refused to copy");
}

// No mode bar: it floats over the top right of a chart, on the heatmap's cells; the charts have
// nothing to zoom that the filters do not do better.
const PLOT_CONFIG = { displaylogo: false, responsive: true, displayModeBar: false };

function failureRate(outcomes, failing) {
  const failures = failing.reduce((n, o) => n + (outcomes[o] || 0), 0);
  const done = Object.values(outcomes).reduce((a, b) => a + b, 0);
  const applicable = done - (outcomes.not_applicable || 0);
  return applicable ? failures / applicable : null;
}
