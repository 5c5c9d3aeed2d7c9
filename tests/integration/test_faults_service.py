"""A faulting or hanging kernel on a real Celery worker: its configs only, every config stored once.

The cpu emulation's oob_store leaves its process's emulated context unusable, as a sticky device
error does on a GPU: the worker process that ran it stores `fault` and ends, Celery replaces it and
delivers the batch again, and the batch's other configs run on a fresh process.
"""
from __future__ import annotations

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import ConfigRun
from tests.integration.conftest import start_worker, stop_worker
from tests.integration.test_service import _wait_status

pytestmark = pytest.mark.integration

BASE = dict(dtype="f16", g=1, seq_len_q=2, seq_len_k=96, num_heads_q=4, num_heads_kv=2, head_dim_qk=32, head_dim_v=32,
            return_lse=True)
# One batch of one variant, split and unsplit configs interleaved: faults in the middle of it.
CONFIGS = [{**BASE, "split_kv": 1 + 2 * (i % 2), "data_seed": i} for i in range(6)]


def _rows(url: str, sweep_id: int) -> list:
    with session_scope(url) as s:
        return s.execute(select(ConfigRun.split_kv, ConfigRun.outcome, ConfigRun.attempts, ConfigRun.starts,
                                ConfigRun.worker, ConfigRun.detail).where(ConfigRun.sweep_id == sweep_id)).all()


@pytest.mark.timeout(300)
def test_a_device_fault_costs_its_config_only_and_every_config_is_stored_once(service, tmp_path):
    worker = start_worker(service, tmp_path, concurrency=1)
    try:
        with service.client() as c:
            resp = c.post("/sweeps", json={"configs": CONFIGS, "backend": "cpu", "defects": ["oob_store"]})
            assert resp.status_code == 202, resp.text
            sweep = _wait_status(c, resp.json()["id"], "done", worker, timeout=240)
            failures = c.get("/failures", params={"sweep": str(sweep["id"]), "outcome": "fault"}).json()["data"]
    finally:
        stop_worker(worker)
    rows = _rows(service.url, sweep["id"])
    assert len(rows) == 6 and {r.attempts for r in rows} == {1}          # each stored once
    assert {(r.split_kv, r.outcome) for r in rows} == {(1, "pass"), (3, "fault")}
    assert sweep["outcomes"]["fault"] == 3 and sweep["outcomes"]["pass"] == 3
    assert len(failures) == 3 and all("ILLEGAL_ADDRESS" in f["detail"] for f in failures)
    assert all("--defect oob_store" in f["reproducer"] for f in failures)
    # every fault ended the process that ran it: the configs after it ran in a fresh one
    assert "device fault; ending this worker process" in worker.log()


@pytest.mark.timeout(300)
def test_a_hanging_kernel_is_stored_as_timeout_and_the_worker_goes_on(service, tmp_path):
    worker = start_worker(service, tmp_path, concurrency=1, ATTNSWEEP_CONFIG_TIME_LIMIT_S="1",
                          ATTNSWEEP_CONFIG_TIME_GRACE_S="5")
    try:
        with service.client() as c:
            resp = c.post("/sweeps", json={"configs": CONFIGS, "backend": "cpu", "defects": ["hang"]})
            assert resp.status_code == 202, resp.text
            sweep = _wait_status(c, resp.json()["id"], "done", worker, timeout=240)
    finally:
        stop_worker(worker)
    rows = _rows(service.url, sweep["id"])
    assert len(rows) == 6 and {r.attempts for r in rows} == {1}
    assert {(r.split_kv, r.outcome) for r in rows} == {(1, "pass"), (3, "timeout")}
    assert all("time limit of 1 s" in r.detail for r in rows if r.outcome == "timeout")
