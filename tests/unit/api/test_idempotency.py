"""Idempotency-Key on POST /sweeps: a retried request gets the first one's sweep, never a second."""
from __future__ import annotations

from tests.unit.api.conftest import BASE, published


def test_same_key_returns_the_same_sweep_and_publishes_once(client, settings):
    body = {"configs": [BASE, {**BASE, "data_seed": 1}], "backend": "cpu", "label": "idem"}
    first = client.post("/sweeps", json=body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 202 and first.json()["published"] is True
    again = client.post("/sweeps", json=body, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"] and again.json()["replayed"] is True
    assert again.headers["Location"] == f"/sweeps/{first.json()['id']}"
    assert client.get("/sweeps").json()["count"] == 1
    assert len(published(settings)) == first.json()["tasks"]
    # Another key, or none, is another sweep.
    assert client.post("/sweeps", json=body, headers={"Idempotency-Key": "k-2"}).json()["id"] != first.json()["id"]
    assert client.post("/sweeps", json=body).status_code == 202
    assert client.get("/sweeps").json()["count"] == 3


def test_same_key_with_another_request_is_422_on_the_key(client):
    assert client.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}, headers={"Idempotency-Key": "k"}).status_code == 202
    resp = client.post("/sweeps", json={"configs": [BASE], "backend": "cpu", "label": "other"}, headers={"Idempotency-Key": "k"})
    assert resp.status_code == 422
    problem = resp.json()["detail"][0]
    assert problem["field"] == "Idempotency-Key" and "another request" in problem["rule"]
    assert client.get("/sweeps").json()["count"] == 1


def test_bad_keys_are_422(client):
    for key in ["x" * 201, "tab\there"]:
        resp = client.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}, headers={"Idempotency-Key": key})
        assert resp.status_code == 422 and resp.json()["detail"][0]["field"] == "Idempotency-Key"
    assert client.get("/sweeps").json()["count"] == 0


def test_rerun_takes_a_key_too(client):
    sid = client.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}).json()["id"]
    a = client.post(f"/sweeps/{sid}/rerun", json={}, headers={"Idempotency-Key": "r"})
    b = client.post(f"/sweeps/{sid}/rerun", json={}, headers={"Idempotency-Key": "r"})
    assert (a.status_code, b.status_code) == (202, 200) and a.json()["id"] == b.json()["id"]
