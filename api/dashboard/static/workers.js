// The workers page: every registered worker (GET /workers) and the queues' and store's gauges
// (GET /metrics, Prometheus text), read again every REFRESH_MS.
"use strict";

const REFRESH_MS = 5000;

// The samples of a Prometheus text exposition: [{name, labels, value}].
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$/);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

async function metricsText() {
  const resp = await authorizedGet("/metrics", "text/plain");
  if (!resp.ok) throw new ApiError(resp.status, [{ field: "/metrics", rule: `HTTP ${resp.status}` }]);
  return resp.text();
}

function byQueue(samples, name) {
  const out = {};
  for (const s of samples) if (s.name === name && s.labels.queue !== undefined) out[s.labels.queue] = s.value;
  return out;
}

function one(samples, name) {
  const s = samples.find((x) => x.name === name);
  return s ? s.value : null;
}

// Every queue the deployment serves (the gauges') and every queue a worker ever registered on:
// a queue whose workers all stopped shows 0 live workers rather than vanishing.
function queueRows(samples, workers) {
  const depth = byQueue(samples, "attnsweep_queue_depth");
  const unacked = byQueue(samples, "attnsweep_tasks_unacked");
  const alive = byQueue(samples, "attnsweep_workers_alive");
  const names = [...new Set([...Object.keys(depth), ...Object.keys(unacked), ...Object.keys(alive),
                             ...workers.map((w) => w.queue)])].sort();
  if (!names.length) return [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no queue reported"))];
  return names.map((q) => el("tr", { "data-queue": q },
    el("td", {}, q), el("td", { class: "depth" }, fmtNumber(depth[q] ?? null)),
    el("td", {}, fmtNumber(unacked[q] ?? null)),
    el("td", { class: "alive" }, alive[q] ? String(alive[q]) : badge("0", "failed"))));
}

function storeRows(samples) {
  const stalled = one(samples, "attnsweep_stalled_seconds");
  const rows = [
    ["configs waiting for a worker", one(samples, "attnsweep_configs_queued")],
    ["configs not yet on the broker", one(samples, "attnsweep_configs_unpublished")],
    ["sweeps with nothing in flight (stuck)", one(samples, "attnsweep_sweeps_stuck")],
    ["seconds since a result was stored while configs wait", stalled === null ? null : Math.round(stalled)],
  ];
  return rows.map(([what, v]) => el("tr", {}, el("td", {}, what), el("td", { class: "gauge" }, fmtNumber(v))));
}

function workerRow(w) {
  return el("tr", { "data-worker": w.name, class: w.alive ? "" : "muted" },
    el("td", {}, w.name), el("td", { class: "state" }, w.alive ? badge("alive", "done") : badge(w.stopped_at ? "stopped" : "silent", "failed")),
    el("td", {}, w.queue), el("td", {}, w.backend), el("td", {}, w.device || "–"), el("td", {}, w.concurrency),
    el("td", {}, fmtTime(w.last_heartbeat)), el("td", {}, fmtTime(w.started_at)), el("td", {}, `${w.hostname}:${w.pid}`));
}

async function refresh() {
  try {
    const [workers, text] = await Promise.all([api("/workers"), metricsText()]);
    const samples = parseMetrics(text);
    const up = one(samples, "attnsweep_broker_up");
    document.getElementById("broker").replaceChildren("broker: ",
      up === null ? badge("not reported") : up ? badge("up", "done") : badge("down", "failed"));
    document.querySelector("#queues tbody").replaceChildren(...queueRows(samples, workers.data));
    document.querySelector("#store-gauges tbody").replaceChildren(...storeRows(samples));
    const alive = workers.data.filter((w) => w.alive).length;
    document.getElementById("worker-count").textContent = `(${alive} alive of ${workers.count})`;
    const rows = [...workers.data].sort((a, b) => (b.alive - a.alive) || a.name.localeCompare(b.name));
    document.querySelector("#workers tbody").replaceChildren(
      ...(rows.length ? rows.map(workerRow) : [el("tr", {}, el("td", { colspan: 9, class: "muted" }, "no worker ever registered"))]));
    document.getElementById("refreshed").textContent = `read ${fmtTime(new Date().toISOString())}`;
    showProblems(null);
  } catch (err) {
    showProblems(err);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
