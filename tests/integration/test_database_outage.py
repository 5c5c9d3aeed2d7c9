"""PostgreSQL out of reach: the API answers 503 with Retry-After, workers retry their batches with
backoff instead of acknowledging them, and everything recovers by itself once it is back.

The outage is real: the API and the worker reach PostgreSQL through a loopback relay
(tests/integration/proxy.py) that the test cuts (connections dropped, new ones refused) and
restores.
"""
from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import ConfigRun
from tests.integration.conftest import start_worker, stop_worker, wait_for
from tests.integration.proxy import Relay

pytestmark = pytest.mark.integration

BASE = dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=96, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=64)
DB_ENDPOINTS = ["/sweeps", "/sweeps/1", "/sweeps/1/results", "/sweeps/1/junit.xml", "/sweeps/1/failures",
                "/sweeps/1/failure-rates?by=dtype", "/failures", "/failures/summary?by=dtype", "/workers",
                "/ci/commits", "/metrics"]


def _relayed(url: str) -> tuple[Relay, str]:
    parts = urlsplit(url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    return relay, url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{relay.port}" if parts.username
                              else f"127.0.0.1:{relay.port}")


def test_api_answers_503_with_retry_after_while_the_database_is_away(service):
    relay, url = _relayed(service.url)
    try:
        with service.client(database_url=url) as c:
            assert c.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}).status_code == 202
            relay.cut()
            for path in DB_ENDPOINTS:
                t0 = time.monotonic()
                resp = c.get(path)
                took = time.monotonic() - t0
                assert resp.status_code == 503, (path, resp.status_code, resp.text[:300])
                assert int(resp.headers["Retry-After"]) > 0, path
                assert took < 5, (path, took)
            resp = c.post("/sweeps", json={"configs": [{**BASE, "data_seed": 1}], "backend": "cpu"})
            assert resp.status_code == 503 and "Retry-After" in resp.headers
            health = c.get("/healthz")
            assert health.status_code == 503 and health.json()["database"].startswith("error")
            relay.restore()
            # Back by itself: the pool drops its dead connections (pre-ping) and reconnects.
            for path in DB_ENDPOINTS:
                assert c.get(path).status_code in (200, 404), path
    finally:
        relay.close()


def test_worker_retries_batches_until_the_database_is_back(service, tmp_path):
    relay, url = _relayed(service.url)
    worker = start_worker(service, tmp_path, ATTNSWEEP_DATABASE_URL=url, ATTNSWEEP_TASK_BATCH_SIZE="2")
    try:
        with service.client() as c:
            relay.cut()
            configs = [{**BASE, "data_seed": i} for i in range(12)]
            resp = c.post("/sweeps", json={"configs": configs, "backend": "cpu"})
            assert resp.status_code == 202, resp.text
            sid = resp.json()["id"]
            # Past Celery's default of 3 retries: the batch keeps waiting as long as the outage lasts.
            wait_for(lambda: "(try 5)" in worker.log(), 90, "a batch's fifth try", interval=0.5)
            assert c.get(f"/sweeps/{sid}").json()["configs_done"] == 0
            relay.restore()
            t0 = time.monotonic()

            def done() -> bool:
                return c.get(f"/sweeps/{sid}").json()["status"] == "done"

            try:
                wait_for(done, 120, "the sweep to finish after the database came back", interval=0.5)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{worker.tail(60)}") from None
            recovery = time.monotonic() - t0
        with session_scope(service.url) as s:
            runs = s.execute(select(ConfigRun.state, ConfigRun.attempts).where(ConfigRun.sweep_id == sid)).all()
        assert len(runs) == 12
        assert {state for state, _ in runs} == {"done"}
        assert {attempts for _, attempts in runs} == {1}, "a config was written twice"
        assert recovery < 60, recovery
    finally:
        stop_worker(worker)
        relay.close()


def test_healthz_reports_a_database_that_answers_but_cannot_write(service):
    """Reads work, writes are refused (here: every transaction read-only, as on a standby; a
    full disk refuses the same probe): /healthz is 503 and says so."""
    import psycopg

    from store.db import get_engine

    name = urlsplit(service.url).path.lstrip("/")
    admin = service.url.rsplit("/", 1)[0] + "/postgres"
    with service.client() as c:
        assert c.get("/healthz").status_code == 200
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        try:
            get_engine(service.url).dispose()   # new connections take the setting
            health = c.get("/healthz")
            assert c.get("/sweeps").status_code == 200   # it still answers
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            get_engine(service.url).dispose()
        assert health.status_code == 503, health.text
        assert health.json()["database"].startswith("error: answers but cannot write"), health.json()
        assert c.get("/healthz").status_code == 200
