"""GET /sweeps/{id}/clusters: pending while the sweep runs, the stored clusters once triaged, 404 unknown."""
from __future__ import annotations

from sweeps.spec import SweepSpec
from tests.unit.api.conftest import BASE
from tests.unit.triage.sweeps import RANGES, run_at


def test_clusters_of_a_triaged_sweep(client, settings):
    sweep_id = run_at(settings.database_url, SweepSpec(samples=60, seed=5, backend="cpu", ranges=RANGES),
                      backend="cpu", device_total_memory=None, device=None,
                      defects=frozenset({"causal_off_by_one"}), triage=True)
    got = client.get(f"/sweeps/{sweep_id}/clusters")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["status"] == "done" and body["error"] is None and len(body["clusters"]) == 1
    c = body["clusters"][0]
    assert c["explanation"]["conditions"] == ["causal=true"] and c["classification"]["kind"] == "deterministic"
    assert c["minimal_config"]["causal"] is True and c["reproducer"].startswith("attnsweep verify")
    assert c["first_bad_commit"] is None and c["size"] == len(c["config_hashes"])
    assert c["reproducer_signature"] == c["signature"]   # run once made, it failed as the bug is named


def test_failures_carry_their_bug_and_filter_by_it_and_sweeps_count_their_bugs(client, settings):
    sweep_id = run_at(settings.database_url, SweepSpec(samples=60, seed=5, backend="cpu", ranges=RANGES),
                      backend="cpu", device_total_memory=None, device=None,
                      defects=frozenset({"causal_off_by_one"}), triage=True)
    untriaged = client.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}).json()["id"]
    [bug] = client.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]
    rows = client.get(f"/sweeps/{sweep_id}/failures", params={"limit": 500}).json()
    assert rows["count"] == bug["size"] and {r["bug"] for r in rows["data"]} == {1}
    only = client.get(f"/sweeps/{sweep_id}/failures", params={"bug": 1, "limit": 500}).json()
    assert sorted(r["config_hash"] for r in only["data"]) == sorted(bug["config_hashes"])
    beyond = client.get(f"/sweeps/{sweep_id}/failures", params={"bug": 2})
    assert beyond.status_code == 422 and f"sweep {sweep_id} has 1 bug" in beyond.text
    assert client.get(f"/sweeps/{untriaged}/failures", params={"bug": 1}).status_code == 422
    listed = {s["id"]: s["bugs"] for s in client.get("/sweeps").json()["data"]}
    assert listed[sweep_id] == 1 and listed[untriaged] is None
    assert client.get(f"/sweeps/{sweep_id}").json()["bugs"] == 1


def test_clusters_of_a_queued_sweep_are_pending_and_an_unknown_sweep_is_404(client):
    accepted = client.post("/sweeps", json={"configs": [BASE], "backend": "cpu"})
    assert accepted.status_code == 202, accepted.text
    got = client.get(f"/sweeps/{accepted.json()['id']}/clusters")
    assert got.status_code == 200 and got.json() == {"status": "pending", "error": None, "clusters": []}
    assert client.get("/sweeps/999999/clusters").status_code == 404


def test_a_combine_bug_is_served_located_at_the_combine(client, settings):
    # oob_store_small stores past O from the combine kernel, the one kernel given O when
    # split_kv > 1: one cluster, whatever family ran it, named fault/-/combine.
    sweep_id = run_at(settings.database_url, SweepSpec(samples=30, seed=5, backend="cpu", ranges=RANGES),
                      backend="cpu", device_total_memory=None, device=None,
                      defects=frozenset({"oob_store_small"}), triage=True)
    body = client.get(f"/sweeps/{sweep_id}/clusters").json()
    assert body["status"] == "done" and len(body["clusters"]) == 1, body
    c = body["clusters"][0]
    assert c["signature"] == {"outcome": "fault", "gate": None, "location": "combine"}
    assert c["signatures"] == {"fault/-/combine": c["size"]} and c["explanation"]["conditions"] == ["split_kv>1"]
    assert c["minimal_config"]["split_kv"] == 2
