"""The service under load: submission, failure queries on a million results, workers vs embedded,
and the API under concurrent clients against a baseline revision.

    .venv/bin/python -m bench.service [--results 1000000] [--sweep-configs 10000] [--e2e-configs 120]
        [--parts submission,e2e,queries,load] [--baseline main] [--clients 20] [--load-rounds 10] [--pace 1]

Needs PostgreSQL and Redis on 127.0.0.1 (as the integration tests). Everything runs on this
machine in a database and under queue names of its own, removed at the end:
1. POST /sweeps of a 10,000-config sweep (sampled, then the same configs as an explicit
   regression set) to a real `attnsweep serve`: time until the 202, and until every task is
   in Redis (enqueueing finishes before the 202, so the two agree). Target <= 2 s.
2. End-to-end configs per second on one sweep: two `attnsweep worker --queue cpu` processes
   (concurrency 1 each) next to the embedded runner with 1 and with 2 processes.
3. GET /failures and /failures/summary p95 over HTTP with 1,000,000 stored results (bulk
   INSERT ... SELECT generate_series), for single-field filters, two-field filters and a
   summary of one sweep; the all-time summary of the whole store is shown on its own line.
   Target <= 50 ms.
4. POST /sweeps of 20-config sampled sweeps and GET /sweeps/{id}, `--clients` at once, against
   this tree's API and `--baseline`'s in alternating phases (bench/api_load.py), saturated and
   paced: p50/p95/p99. Target: POST p99 <= 250 ms.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and __package__ in (None, ""):
    sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import httpx  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402

from bench.api_load import compare, export_revision  # noqa: E402
from harness import ServiceStack, service_env, wait_for  # noqa: E402

PG_ADMIN = os.environ.get("ATTNSWEEP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("ATTNSWEEP_TEST_REDIS", "redis://127.0.0.1:6379/0")
# The benchmark's own API token (the API refuses writes without one).
API_SECRET = "bench-" + "5e7c" * 8
AUTH = {"Authorization": f"Bearer {API_SECRET}"}
E2E_RANGES = {"seq_len_k": [1, 512], "seq_len_q": [1, 64]}

# One statement: 100 sweeps of 10,000 results each with the outcome mix of a GPU farm's nightly
# runs (about 94% pass, 2% not_applicable, 4% failing), sizes and flags spread by hashes of i.
BULK_SQL = """
INSERT INTO sweeps (id, label, status, seed, backend, request, samples, draws, configs_total, splitkv_budget,
                    budget_source, queue, created_at, started_at, finished_at)
SELECT {base} + s, 'bench-' || s, 'done', s, 'cuda', '{{}}'::json, {per}, {per}, {per}, 8589934592, 'device', 'gpu',
       now() - interval '200 days' + s * interval '1 day', now() - interval '200 days' + s * interval '1 day',
       now() - interval '200 days' + s * interval '1 day' + interval '3 hours'
FROM generate_series(1, {sweeps}) AS s;

INSERT INTO config_runs (
  sweep_id, seq, config_hash, config, dtype, g, seq_len_q, seq_len_k, num_heads_q, num_heads_kv, gqa_ratio,
  head_dim_qk, head_dim_v, with_attn_scale, with_attn_bias, causal, has_prefix_offset, kv_cache,
  trans_q, trans_k, trans_v, trans_o, return_lse, split_kv, data_seed, state, outcome, failed_gate, detail,
  rms_threshold, threshold_reason, backend, device, variant, block_n, source_hash, total_s,
  out_rms, out_row_err, out_max_abs, out_nonfinite, reproducer, worker, attempts, finished_at)
SELECT
  {base} + 1 + i / {per}, i % {per}, md5(i::text),
  json_build_object('dtype', dtype, 'g', g, 'seq_len_q', sq, 'seq_len_k', sk, 'num_heads_q', hq, 'num_heads_kv', hq / ratio,
                    'head_dim_qk', hd, 'head_dim_v', hd, 'split_kv', skv, 'causal', causal, 'data_seed', i),
  dtype, g, CASE WHEN kv THEN 1 ELSE sq END, sk, hq, hq / ratio, ratio,
  hd, hd, (i % 2) = 0, (i % 3) = 0, causal, causal AND (i % 5) = 0, kv,
  (i % 7) = 0, (i % 11) = 0, (i % 13) = 0, (i % 17) = 0, skv > 1, skv, i, 'done', outcome,
  CASE WHEN outcome = 'fail' THEN (ARRAY['rms', 'row', 'lse', 'partials'])[1 + (i / 7) % 4]
       WHEN outcome = 'nan' THEN 'rms' END,
  CASE WHEN outcome = 'pass' THEN 'all gates hold' ELSE 'out_rms above the threshold' END,
  0.005, 'default', 'cuda', 'NVIDIA H200', 'attn_' || dtype || '_qk' || hd, 32, 'abc123', random(),
  CASE WHEN outcome = 'nan' THEN 'NaN'::float8 ELSE random() * 0.01 END, random() * 0.01, random(), 0,
  'attnsweep verify --backend cuda --config ''{{"dtype":"' || dtype || '","g":' || g || ',"seq_len_k":' || sk
    || '}}'' --gates ''{{"rms":0.005,"rms_reason":"default","row":0.02}}''',
  'gpu' || (i % 8) || '@host', 1, now() - ({total} - i) * interval '15 seconds'
FROM (
  SELECT i, (ARRAY['f16', 'bf16', 'f32', 'i8'])[1 + h % 4] AS dtype, 1 + (h / 4) % 16 AS g,
         1 << ((h / 64) % 13) AS sq, 1 << ((h / 832) % 15) AS sk, 1 << (1 + (h / 12480) % 6) AS hq,
         1 << ((h / 74880) % 2) AS ratio, (ARRAY[32, 64, 80, 96, 128, 192, 256, 17, 500])[1 + (h / 149760) % 9] AS hd,
         (h / 7) % 2 = 0 AS causal, (h / 3) % 2 = 0 AS kv,
         CASE WHEN (h / 11) % 2 = 0 THEN 1 ELSE 1 << ((h / 22) % 8) END AS skv,
         CASE WHEN o < 940 THEN 'pass' WHEN o < 960 THEN 'not_applicable' WHEN o < 980 THEN 'fail'
              WHEN o < 988 THEN 'nan' WHEN o < 993 THEN 'error' WHEN o < 998 THEN 'timeout' ELSE 'oom' END AS outcome
  FROM (SELECT i, abs(hashtext(i::text)) AS h, abs(hashtext('o' || i::text)) % 1000 AS o
        FROM generate_series(0, {total} - 1) AS i) AS hashed
) AS drawn;
SELECT setval(pg_get_serial_sequence('sweeps', 'id'), (SELECT max(id) FROM sweeps));
"""

QUERY_MIX: dict[str, list[str]] = {
    "single field": ["/failures?dtype=f16", "/failures?split_kv=4", "/failures?seq_len_k=1024:", "/failures?gate=row",
                     "/failures?outcome=nan", "/failures?causal=true", "/failures?label=bench-7",
                     "/failures?head_dim_qk=500"],
    "two fields": ["/failures?dtype=bf16&split_kv=8", "/failures?causal=true&kv_cache=true",
                   "/failures?head_dim_qk=128&gate=rms", "/failures?label=bench-3&dtype=i8",
                   "/failures?g=16&seq_len_q=4096", "/failures?outcome=timeout&dtype=f32"],
    "summary of a sweep": ["/failures/summary?by=dtype,split_kv&label=bench-5", "/failures/summary?by=causal&label=bench-9",
                           "/failures/summary?by=head_dim_qk,dtype&sweep={last_sweep}"],
}
ALL_TIME = ["/failures/summary?by=dtype", "/failures/summary?by=dtype,split_kv"]


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        tag = uuid.uuid4().hex[:8]
        self.db_name = f"attnsweep_bench_{tag}"
        self.url = PG_ADMIN.rsplit("/", 1)[0] + "/" + self.db_name
        self.prefix = f"bench{tag}-"
        self.rows: list[tuple[str, str, str]] = []
        self.logs = Path(f"/tmp/attnsweep-bench-{tag}")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.stack = self._stack(self.url, self.prefix, self.logs, ROOT)
        self.baseline: ServiceStack | None = None

    @staticmethod
    def _stack(url: str, prefix: str, logs: Path, root: Path) -> ServiceStack:
        return ServiceStack(service_env(url, REDIS_URL, prefix, ATTNSWEEP_HEARTBEAT_S="1",
                                        ATTNSWEEP_MAX_BODY_BYTES=str(64 << 20),
                                        ATTNSWEEP_API_TOKENS=f"bench:admin:{API_SECRET}"),
                            logs, root=root, headers=AUTH)

    # --- set-up and tear-down -----------------------------------------------------------------
    def setup(self) -> None:
        from store.migrate import upgrade

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db_name}"')
        upgrade(self.url)
        self.stack.start_api()
        self.http = httpx.Client(base_url=self.stack.url(""), timeout=120, headers=AUTH)

    def teardown(self) -> None:
        self.stack.stop()
        if self.baseline is not None:
            self.baseline.stop()
        from store.db import get_engine

        get_engine(self.url).dispose()
        r = redis.Redis.from_url(REDIS_URL)
        for prefix in (self.prefix, f"base{self.prefix}"):
            keys = [k for p in (f"{prefix}*", f"_kombu.binding.{prefix}*") for k in r.scan_iter(p)]
            if keys:
                r.delete(*keys)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            for name in (self.db_name, f"{self.db_name}_base"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def sql(self, text: str) -> Any:
        with psycopg.connect(self.url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
            return conn.execute(text).fetchall() if text.lstrip().upper().startswith("SELECT") else conn.execute(text)

    # --- 1. submission -----------------------------------------------------------------------
    def submission(self) -> None:
        from sweeps.sampler import sample
        from sweeps.spec import SweepSpec

        n = self.args.sweep_configs
        queue = f"{self.prefix}cpu"
        r = redis.Redis.from_url(REDIS_URL)
        request = {"samples": n, "seed": 2026, "backend": "cpu", "label": "bench-submit"}
        t0 = time.perf_counter()
        resp = self.http.post("/sweeps", json=request)
        t_answer = time.perf_counter() - t0
        resp.raise_for_status()
        tasks = resp.json()["tasks"]
        wait_for(lambda: r.llen(queue) >= tasks, 60, "every task in Redis", interval=0.001)
        t_queued = time.perf_counter() - t0
        self.rows.append((f"POST /sweeps, {n:,} sampled configs: 202 answered", f"{t_answer:.2f} s", "<= 2 s"))
        self.rows.append((f"  ... every config enqueued ({tasks:,} tasks in Redis)", f"{t_queued:.2f} s", "<= 2 s"))
        configs = [c.to_dict() for c in sample(SweepSpec(samples=n, seed=2026, backend="cpu"), 3 << 29).configs]
        r.delete(queue)
        t0 = time.perf_counter()
        resp = self.http.post("/sweeps", json={"configs": configs, "backend": "cpu", "label": "bench-regression"})
        t_answer = time.perf_counter() - t0
        resp.raise_for_status()
        wait_for(lambda: r.llen(queue) >= resp.json()["tasks"], 60, "every task in Redis", interval=0.001)
        t_queued = time.perf_counter() - t0
        self.rows.append((f"POST /sweeps, {n:,} explicit configs: 202 / all enqueued", f"{t_answer:.2f} / {t_queued:.2f} s", "<= 2 s"))
        for sweep in self.http.get("/sweeps").json()["data"]:
            self.http.post(f"/sweeps/{sweep['id']}/cancel", json={})
        r.delete(queue)
        r.close()

    # --- 2. end to end -------------------------------------------------------------------------
    def end_to_end(self) -> None:
        from store.db import session_scope, unit_of_work
        from workers.embedded import execute_sweep
        from store import repo
        from sweeps.plan import plan_sweep
        from sweeps.spec import SweepSpec

        n = self.args.e2e_configs
        spec = SweepSpec(samples=n, seed=99, backend="cpu", ranges=E2E_RANGES, label="bench-e2e")
        for jobs in (1, 2):
            with session_scope(self.url) as s:
                sweep_id = repo.store_plan(s, plan_sweep(spec, device_total_memory=None, device="cpu")).id
            t0 = time.perf_counter()
            with unit_of_work(self.url) as session:
                execute_sweep(session, sweep_id, "cpu", jobs=jobs)
            wall = time.perf_counter() - t0
            self.rows.append((f"embedded runner, {jobs} process{'es' if jobs > 1 else ''}, {n} configs",
                              f"{n / wall:.1f} configs/s", f"{wall:.1f} s"))
        workers = [self.stack.start_worker(f"bench{i}@{self.prefix}", concurrency=1, wait=False) for i in range(2)]
        wait_for(lambda: len([w for w in self.http.get("/workers?alive=true").json()["data"]
                              if w["queue"] == f"{self.prefix}cpu"]) == 2, 90, "two registered workers", interval=0.2)
        t0 = time.perf_counter()
        sid = self.http.post("/sweeps", json=spec.model_dump(mode="json")).json()["id"]
        wait_for(lambda: self.http.get(f"/sweeps/{sid}").json()["status"] == "done", 1800, "the sweep", interval=0.1)
        wall = time.perf_counter() - t0
        self.rows.append((f"2 cpu workers via API + Redis + PostgreSQL, {n} configs", f"{n / wall:.1f} configs/s",
                          f"{wall:.1f} s (POST to done)"))
        for proc in workers:
            proc.stop(grace_s=30)

    # --- 3. failure queries over a million results -------------------------------------------------
    def failure_queries(self) -> None:
        total = self.args.results
        per = 10_000
        base = self.sql("SELECT coalesce(max(id), 0) FROM sweeps")[0][0]
        t0 = time.perf_counter()
        self.sql(BULK_SQL.format(base=base, per=per, sweeps=total // per, total=total))
        self.sql("VACUUM ANALYZE config_runs")
        self.sql("VACUUM ANALYZE sweeps")
        load = time.perf_counter() - t0
        stored = self.sql("SELECT count(*), count(*) FILTER (WHERE outcome IN ('fail','nan','error','timeout','oom')) FROM config_runs")[0]
        self.rows.append((f"bulk load: {stored[0]:,} results, {stored[1]:,} failures", f"{load:.0f} s", "INSERT ... SELECT"))
        last = base + total // per
        rounds = self.args.rounds
        for path in [p for ps in QUERY_MIX.values() for p in ps] + ALL_TIME:  # warm the cache once
            self.http.get(path.format(last_sweep=last)).raise_for_status()
        per_kind: dict[str, list[float]] = {kind: [] for kind in QUERY_MIX}
        for _ in range(rounds):
            for kind, paths in QUERY_MIX.items():
                for path in paths:
                    t = time.perf_counter()
                    resp = self.http.get(path.format(last_sweep=last))
                    per_kind[kind].append(time.perf_counter() - t)
                    assert resp.status_code == 200, resp.text
        mix = [x for xs in per_kind.values() for x in xs]
        for kind, xs in per_kind.items():
            self.rows.append((f"GET {kind} ({len(xs)} requests)", f"p50 {statistics.median(xs) * 1e3:.1f} / p95 {p95(xs) * 1e3:.1f} ms", "p95 <= 50 ms"))
        self.rows.append((f"GET /failures mix, all {len(mix)} requests", f"p95 {p95(mix) * 1e3:.1f} ms", "<= 50 ms"))
        whole = []
        for _ in range(max(3, rounds // 4)):
            for path in ALL_TIME:
                t = time.perf_counter()
                self.http.get(path).raise_for_status()
                whole.append(time.perf_counter() - t)
        self.rows.append((f"GET /failures/summary of the whole store ({len(whole)} requests)",
                          f"p50 {statistics.median(whole) * 1e3:.0f} / p95 {p95(whole) * 1e3:.0f} ms", "full scan; not in the mix"))

    # --- 4. the API under concurrent clients, against a baseline ---------------------------------
    def api_load(self) -> None:
        from store.migrate import upgrade

        stacks = {"this tree": self.stack}
        if self.args.baseline:
            name = f"{self.db_name}_base"
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
            upgrade(url)
            (self.logs / "baseline").mkdir()
            tree = export_revision(ROOT, self.args.baseline, self.logs / "baseline-tree")
            self.baseline = self._stack(url, f"base{self.prefix}", self.logs / "baseline", tree)
            self.baseline.start_api()
            stacks = {f"baseline {self.args.baseline}": self.baseline, **stacks}
        self.rows += compare(stacks, self.args.clients, self.args.load_rounds, self.args.phases, self.args.pace)

    def report(self) -> None:
        w0 = max(len(r[0]) for r in self.rows)
        w1 = max(len(r[1]) for r in self.rows)
        print(f"\n{'measure'.ljust(w0)}  {'result'.ljust(w1)}  target / note")
        print(f"{'-' * w0}  {'-' * w1}  {'-' * 24}")
        for name, value, note in self.rows:
            print(f"{name.ljust(w0)}  {value.ljust(w1)}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=1_000_000, help="stored results for the query benchmark (multiple of 10,000)")
    parser.add_argument("--sweep-configs", type=int, default=10_000)
    parser.add_argument("--e2e-configs", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=20, help="repetitions of the query mix")
    parser.add_argument("--parts", default="submission,e2e,queries,load", help="which parts, comma-separated")
    parser.add_argument("--baseline", default="main", help="the revision the load part compares with ('' for none)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients of the load part")
    parser.add_argument("--load-rounds", type=int, default=10, help="sweeps each client submits per phase")
    parser.add_argument("--phases", type=int, default=2, help="phases per API, alternating")
    parser.add_argument("--pace", type=float, default=1.0, help="seconds between a paced client's rounds")
    args = parser.parse_args()
    parts = {"submission": "submission", "e2e": "end_to_end", "queries": "failure_queries", "load": "api_load"}
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    if any(p not in parts for p in chosen):
        parser.error(f"--parts: one or more of {', '.join(parts)}")
    bench = Bench(args)
    try:
        bench.setup()
        for part in chosen:
            getattr(bench, parts[part])()
    finally:
        bench.teardown()
        bench.report()


if __name__ == "__main__":
    main()
