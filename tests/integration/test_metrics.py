"""/metrics from the store and the broker: queued configs of live sweeps only, unpublished
configs, stuck sweeps, broker reachability, queue depth and unacknowledged tasks."""
from __future__ import annotations

import re

import pytest
from sqlalchemy import update

from store import repo
from store.db import session_scope
from store.models import ConfigRun

pytestmark = pytest.mark.integration

BASE = dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=96, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=64)


def _value(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def test_metrics_count_live_sweeps_only_and_read_the_broker(service, private_redis):
    queue = service.settings.queue_name("cpu")
    with service.client(broker_url=private_redis.url) as c:
        live = c.post("/sweeps", json={"configs": [{**BASE, "data_seed": i} for i in range(3)], "backend": "cpu",
                                       "seed": 1}).json()
        dead = c.post("/sweeps", json={"configs": [{**BASE, "data_seed": i} for i in range(5)], "backend": "cpu",
                                       "seed": 2}).json()
        with session_scope(service.url) as s:
            repo.set_status(s, dead["id"], "failed", error="a failed sweep's configs wait for nobody")
        text = c.get("/metrics").text
        assert _value(text, "attnsweep_configs_queued") == 3
        assert _value(text, "attnsweep_configs_unpublished") == 0
        assert _value(text, "attnsweep_broker_up") == 1
        assert _value(text, "attnsweep_queue_depth", f'{{queue="{queue}"}}') == live["tasks"] + dead["tasks"]
        assert _value(text, "attnsweep_tasks_unacked", f'{{queue="{queue}"}}') == 0
        assert _value(text, "attnsweep_sweeps_stuck") == 0
        assert 0 <= _value(text, "attnsweep_stalled_seconds") < 60
        # A sweep whose configs were committed but never published, long ago: unpublished and stuck.
        with session_scope(service.url) as s:
            s.execute(update(ConfigRun).where(ConfigRun.sweep_id == live["id"]).values(enqueued_at=None))
            s.execute(repo.Sweep.__table__.update().where(repo.Sweep.id == live["id"])
                      .values(created_at=repo.now().replace(year=2020)))
        text = c.get("/metrics").text
        assert _value(text, "attnsweep_configs_unpublished") == 3
        assert _value(text, "attnsweep_sweeps_stuck") == 1
        assert _value(text, "attnsweep_stalled_seconds") > 365 * 86400   # nothing moved since 2020
        private_redis.kill()
        text = c.get("/metrics").text
        assert _value(text, "attnsweep_broker_up") == 0
        assert "attnsweep_queue_depth{" not in text


def test_metrics_count_configs_by_outcome_backend_dtype_and_histogram_run_times(service):
    with service.client() as c:
        sweep = c.post("/sweeps", json={"configs": [{**BASE, "data_seed": i, "dtype": "f16" if i < 3 else "bf16"}
                                                    for i in range(5)], "backend": "cpu", "seed": 3}).json()
        text = c.get("/metrics").text
        assert "attnsweep_configs{" not in text  # nothing finished yet
        # Results as a worker stores them: outcome, backend, run time.
        stored = [("pass", 0.02), ("pass", 0.3), ("fail", 7.0), ("nan", 0.2), ("pass", 400.0)]
        with session_scope(service.url) as s:
            ids = [r.id for r in s.query(ConfigRun).filter(ConfigRun.sweep_id == sweep["id"]).order_by(ConfigRun.seq)]
            for run_id, (outcome, seconds) in zip(ids, stored):
                s.execute(update(ConfigRun).where(ConfigRun.id == run_id)
                          .values(state="done", outcome=outcome, backend="cpu", total_s=seconds, finished_at=repo.now()))
        text = c.get("/metrics").text
    assert _value(text, "attnsweep_configs", '{backend="cpu",dtype="f16",outcome="pass"}') == 2
    assert _value(text, "attnsweep_configs", '{backend="cpu",dtype="f16",outcome="fail"}') == 1
    assert _value(text, "attnsweep_configs", '{backend="cpu",dtype="bf16",outcome="nan"}') == 1
    assert _value(text, "attnsweep_configs", '{backend="cpu",dtype="bf16",outcome="pass"}') == 1
    bucket = lambda le: _value(text, "attnsweep_config_run_seconds_bucket", f'{{backend="cpu",le="{le}"}}')  # noqa: E731
    assert [bucket("0.05"), bucket("0.25"), bucket("0.5"), bucket("10"), bucket("300"), bucket("+Inf")] == [1, 2, 3, 4, 4, 5]
    assert _value(text, "attnsweep_config_run_seconds_count", '{backend="cpu"}') == 5
    assert _value(text, "attnsweep_config_run_seconds_sum", '{backend="cpu"}') == pytest.approx(407.52)


def test_grafana_example_queries_only_metrics_the_api_exports(service):
    """docs/grafana-dashboard.json names no metric that /metrics does not serve."""
    import json
    from pathlib import Path

    dash = json.loads((Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\b(attnsweep_[a-z_]+)", e)}
    with service.client() as c:
        c.get("/sweeps")
        text = c.get("/metrics").text
    served = set(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    families = {name for name, _ in served}
    histograms = {name for name, kind in served if kind == "histogram"}
    exported = families | {f"{h}_{s}" for h in histograms for s in ("bucket", "count", "sum")} | {f"{c}_total" for c in families}
    assert named and named <= exported, named - exported
