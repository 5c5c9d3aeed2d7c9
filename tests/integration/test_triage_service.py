"""A sweep with a planted defect through the service (PostgreSQL, Redis, a real worker): once its
last config is stored, the worker triages it and GET /sweeps/{id}/clusters serves one bug."""
from __future__ import annotations

import pytest

from tests.integration.conftest import wait_for
from tests.unit.triage.sweeps import RANGES

pytestmark = pytest.mark.integration


def test_a_defect_sweep_gets_its_clusters_from_a_worker(service, worker):
    with service.client() as c:
        resp = c.post("/sweeps", json={"samples": 40, "seed": 5, "backend": "cpu", "ranges": RANGES,
                                       "defects": ["causal_off_by_one"]})
        assert resp.status_code == 202, resp.text
        sweep_id = resp.json()["id"]
        assert c.get(f"/sweeps/{sweep_id}/clusters").json()["status"] in ("pending", "running")

        def triaged():
            body = c.get(f"/sweeps/{sweep_id}/clusters").json()
            if body["status"] == "failed":
                raise AssertionError(f"triage failed: {body['error']}\n{worker.tail()}")
            return body if body["status"] == "done" else None

        body = wait_for(triaged, 240, f"the triage of sweep {sweep_id}\n{worker.tail()}", interval=1.0)
        sweep = c.get(f"/sweeps/{sweep_id}").json()
    assert sweep["status"] == "done"
    failing = sum(n for o, n in sweep["outcomes"].items() if o not in ("pass", "not_applicable"))
    assert failing > 0 and len(body["clusters"]) == 1
    bug = body["clusters"][0]
    assert bug["size"] == failing and "causal=true" in bug["explanation"]["conditions"]
    assert bug["classification"]["kind"] == "deterministic" and bug["minimal_config"]["causal"] is True
    assert "--defect causal_off_by_one" in bug["reproducer"]
