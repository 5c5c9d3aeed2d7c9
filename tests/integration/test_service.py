"""Submit over HTTP, let a real Celery worker run the configs, query results and failures in PostgreSQL."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import func, select

from store.db import session_scope
from store.models import ConfigRun, Sweep
from tests.integration.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration

BASE = dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=96, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=64)
SMALL = {"seq_len_k": [1, 256], "seq_len_q": [1, 32]}


def _strict_json(text: str):  # noqa: ANN202
    def refuse(name: str):  # noqa: ANN202
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _wait_status(client, sweep_id: int, status: str, worker, timeout: float = 120) -> dict:  # noqa: ANN001
    def reached() -> dict | None:
        body = client.get(f"/sweeps/{sweep_id}").json()
        return body if body["status"] == status else None

    try:
        return wait_for(reached, timeout, f"sweep {sweep_id} to be {status}", interval=0.3)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nworker log:\n{worker.tail()}") from None


def _count(url: str, model, *where) -> int:  # noqa: ANN001
    with session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(model).where(*where))


def test_sampled_sweep_runs_on_a_real_worker_to_done(service, worker):
    from sweeps.sampler import sample
    from sweeps.spec import SweepSpec

    label = f"it-{uuid.uuid4().hex[:6]}"
    with service.client() as c:
        resp = c.post("/sweeps", json={"samples": 10, "seed": 7, "backend": "cpu", "label": label, "ranges": SMALL})
        assert resp.status_code == 202, resp.text
        accepted = resp.json()
        sweep = _wait_status(c, accepted["id"], "done", worker)
        results = c.get(f"/sweeps/{accepted['id']}/results?limit=100").json()
        workers = c.get("/workers").json()["data"]

    assert (sweep["configs_total"], sweep["configs_done"]) == (10, 10)
    assert sweep["outcomes"]["pass"] == 10, sweep["outcomes"]  # the cpu emulation of correct kernels passes
    assert sum(sweep["filtered"].values()) == sweep["draws"] - 10
    assert sweep["started_at"] <= sweep["finished_at"] and sweep["throughput"] > 0
    assert results["count"] == 10 and [r["seq"] for r in results["data"]] == list(range(10))
    assert {(r["state"], r["worker"], r["backend"]) for r in results["data"]} == {("done", worker.name, "cpu")}
    expected = sample(SweepSpec(samples=10, seed=7, backend="cpu", ranges=SMALL), accepted["splitkv_budget"])
    assert [r["config"] for r in results["data"]] == [cfg.to_dict() for cfg in expected.configs]
    mine = [w for w in workers if w["name"] == worker.name]
    assert mine and mine[0]["alive"] and mine[0]["queue"] == service.settings.queue_name("cpu")
    assert "emulation" in mine[0]["device"] and mine[0]["concurrency"] == 2
    assert _count(service.url, ConfigRun, ConfigRun.state == "done") == 10  # written once per config


def test_regression_set_failures_summary_reproducer_and_rerun_of_failures(service, worker):
    label = f"reg-{uuid.uuid4().hex[:6]}"
    passing = [{**BASE, "data_seed": i} for i in range(3)]
    failing = [{**BASE, "dtype": "bf16", "data_seed": i, "rms_threshold": 1e-30} for i in range(2)]
    with service.client() as c:
        resp = c.post("/sweeps", json={"configs": passing + failing, "backend": "cpu", "label": label})
        assert resp.status_code == 202, resp.text
        sid = resp.json()["id"]
        sweep = _wait_status(c, sid, "done", worker)
        assert (sweep["outcomes"]["pass"], sweep["outcomes"]["fail"], sweep["configs_done"]) == (3, 2, 5)
        assert sweep["draws"] == 0 and sweep["filtered"] == {}

        failures = c.get("/failures", params={"label": label}).json()["data"]
        assert len(failures) == 2
        assert {(f["outcome"], f["failed_gate"], f["config"]["dtype"]) for f in failures} == {("fail", "rms", "bf16")}
        assert c.get("/failures", params={"label": label, "dtype": "f16"}).json()["data"] == []
        summary = c.get("/failures/summary", params={"by": "dtype", "label": label}).json()
        rates = {g["key"]["dtype"]: (g["runs"], g["failures"], g["failure_rate"]) for g in summary["groups"]}
        assert rates == {"bf16": (2, 2, 1.0), "f16": (3, 0, 0.0)}

        rerun = c.post(f"/sweeps/{sid}/rerun", json={"failures_only": True})
        assert rerun.status_code == 202, rerun.text
        again = _wait_status(c, rerun.json()["id"], "done", worker)
        assert (again["rerun_of"], again["configs_total"], again["outcomes"]["fail"], again["label"]) == (sid, 2, 2, label)
        assert len(c.get("/failures", params={"label": label}).json()["data"]) == 4

    # The stored reproducer re-runs the config with the sweep's gates and gets the same verdict.
    argv = shlex.split(failures[0]["reproducer"])
    assert argv[:2] == ["attnsweep", "verify"] and "--gates" in argv
    proc = subprocess.run([sys.executable, "-m", "cli", *argv[1:], "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["outcome"] == "fail"


def test_defect_sweep_is_caught_as_nan(service, worker):
    configs = [{**BASE, "seq_len_q": 1, "return_lse": True, "split_kv": 4, "current_seq_len": [3], "data_seed": i}
               for i in range(2)]
    with service.client() as c:
        resp = c.post("/sweeps", json={"configs": configs, "backend": "cpu", "defects": ["no_zero_sum_guard"]})
        assert resp.status_code == 202, resp.text
        sid = resp.json()["id"]
        sweep = _wait_status(c, sid, "done", worker)
        assert sweep["outcomes"]["nan"] == 2 and sweep["request"]["defects"] == ["no_zero_sum_guard"]
        raw = c.get("/failures", params={"sweep": str(sid), "outcome": "nan"})
    body = _strict_json(raw.text)
    assert len(body["data"]) == 2
    assert body["data"][0]["metrics"]["out_nonfinite"] > 0
    assert "--defect no_zero_sum_guard" in body["data"][0]["reproducer"]


def test_non_finite_metrics_survive_postgresql_and_are_valid_json(service):
    import math

    from store import repo

    with service.client() as c:
        sid = c.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}).json()["id"]
        with session_scope(service.url) as s:
            h = repo.queued_configs(s, sid)[0][0]
            repo.record_result(s, sid, h, {"outcome": "nan", "failed_gate": "rms", "out_rms": math.nan,
                                           "out_max_abs": math.inf, "lse_max_abs": -math.inf, "out_row_err": 0.25})
        raw = c.get(f"/sweeps/{sid}/results")
    metrics = _strict_json(raw.text)["data"][0]["metrics"]
    assert (metrics["out_rms"], metrics["out_max_abs"], metrics["lse_max_abs"], metrics["out_row_err"]) == ("nan", "inf", "-inf", 0.25)


def test_cancel_skips_the_remaining_configs_and_stays_cancelled(service, worker):
    heavier = [{**BASE, "seq_len_q": 256, "seq_len_k": 1024, "num_heads_q": 8, "num_heads_kv": 8, "head_dim_qk": 128,
                "head_dim_v": 128, "dtype": "f32", "data_seed": i} for i in range(40)]
    with service.client() as c:
        sid = c.post("/sweeps", json={"configs": heavier, "backend": "cpu"}).json()["id"]
        cancelled = c.post(f"/sweeps/{sid}/cancel", json={})
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

        def settled() -> bool:  # the worker drains the queue: finishes what it started, skips the rest
            with session_scope(service.url) as s:
                return s.scalar(select(func.count()).select_from(ConfigRun).where(
                    ConfigRun.sweep_id == sid, ConfigRun.state == "queued")) == 0
        wait_for(settled, 60, "no queued config left")
        import time

        time.sleep(3)  # batches already picked up finish their current config
        sweep = c.get(f"/sweeps/{sid}").json()
    done = _count(service.url, ConfigRun, ConfigRun.sweep_id == sid, ConfigRun.state == "done")
    skipped = _count(service.url, ConfigRun, ConfigRun.sweep_id == sid, ConfigRun.state == "cancelled")
    assert sweep["status"] == "cancelled"
    assert done + skipped == 40 and skipped > 20, (done, skipped)
    assert sweep["configs_done"] == done


def test_auth_and_bad_payloads_write_nothing(service):
    token = "it-token-" + uuid.uuid4().hex
    with service.client(headers={}, api_tokens=f"it:submit:{token}", max_body_bytes=4096) as c:
        body = {"samples": 2, "backend": "cpu", "ranges": SMALL}
        assert c.post("/sweeps", json=body).status_code == 401
        assert c.post("/sweeps", json=body, headers={"Authorization": "Bearer wrong-" + token}).status_code == 403
        auth = {"Authorization": f"Bearer {token}"}
        bad = c.post("/sweeps", json={"configs": [BASE, {**BASE, "head_dim_qk": 4096}], "backend": "cpu"}, headers=auth)
        assert bad.status_code == 422
        problems = {p["field"]: p["rule"] for p in bad.json()["detail"]}
        assert "configs.1.head_dim_qk" in problems and "1024" in problems["configs.1.head_dim_qk"]
        wrong_type = c.post("/sweeps", json={"samples": "many"}, headers=auth)
        assert wrong_type.status_code == 422 and wrong_type.json()["detail"][0]["field"] == "samples"
        big = c.post("/sweeps", json={"configs": [{**BASE, "data_seed": i} for i in range(100)]}, headers=auth)
        assert big.status_code == 413
        assert _count(service.url, Sweep) == 0 and _count(service.url, ConfigRun) == 0
        ok = c.post("/sweeps", json=body, headers=auth)
        assert ok.status_code == 202
        health = c.get("/healthz")
        assert health.status_code == 200 and health.json()["broker"] == "ok"
    assert _count(service.url, Sweep) == 1 and _count(service.url, ConfigRun) == 2
