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
        # A sweep whose configs were committed but never published, long ago: unpublished and stuck.
        with session_scope(service.url) as s:
            s.execute(update(ConfigRun).where(ConfigRun.sweep_id == live["id"]).values(enqueued_at=None))
            s.execute(repo.Sweep.__table__.update().where(repo.Sweep.id == live["id"])
                      .values(created_at=repo.now().replace(year=2020)))
        text = c.get("/metrics").text
        assert _value(text, "attnsweep_configs_unpublished") == 3
        assert _value(text, "attnsweep_sweeps_stuck") == 1
        private_redis.kill()
        text = c.get("/metrics").text
        assert _value(text, "attnsweep_broker_up") == 0
        assert "attnsweep_queue_depth{" not in text
