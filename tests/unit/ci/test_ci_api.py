"""The CI endpoints on SQLite with kombu's in-memory broker: priorities, replays, broker refusal, 404/422."""
from __future__ import annotations

import uuid

import pytest

from store.db import session_scope
from store.migrate import upgrade
from store.models import CiDelivery, Sweep
from tests.unit.api.conftest import make_client, make_settings
from tests.unit.ci.hooks import KernelRepo, deliver, push_payload
from workers.app import CI_PRIORITY, SWEEP_PRIORITY, create_celery

SECRET = "unit-webhook-secret-91c2"
SMALL = {"ranges": {"seq_len_k": [1, 128], "seq_len_q": [1, 4], "g": [1, 2]}}


@pytest.fixture
def repo(tmp_path) -> KernelRepo:
    return KernelRepo(tmp_path / "repo")


def _settings(sqlite_url, repo, **kw):  # noqa: ANN001, ANN202
    upgrade(sqlite_url)
    return make_settings(sqlite_url, webhook_secret=SECRET, kernel_repo=str(repo.path), ci_samples=3, ci_backend="cpu",
                         ci_spec=SMALL, **kw)


def _priorities(settings) -> list[int]:  # noqa: ANN001
    celery = create_celery(settings)
    out = []
    with celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(settings.queue_name("cpu"), no_ack=True)
        while True:
            try:
                msg = queue.get(block=False)
            except queue.Empty:
                break
            out.append(msg.properties["priority"])
        queue.close()
    return out


def test_ci_tasks_carry_the_ci_priority_and_other_sweeps_the_sweep_priority(sqlite_url, repo):
    settings = _settings(sqlite_url, repo)
    sha = repo.commit("k")
    assert CI_PRIORITY < SWEEP_PRIORITY  # Redis pops the lowest priority step first
    with make_client(settings) as c:
        assert c.post("/sweeps", json={"samples": 2, "backend": "cpu", **SMALL}).status_code == 202
        nightly = set(_priorities(settings))
        assert deliver(c, SECRET, "push", push_payload("o/r", "main", sha)).status_code == 202
        ci = set(_priorities(settings))
    assert (nightly, ci) == ({SWEEP_PRIORITY}, {CI_PRIORITY})


def test_unknown_commits_bad_shas_and_missing_sweeps(sqlite_url, repo):
    with make_client(_settings(sqlite_url, repo)) as c:
        assert c.get(f"/ci/{'e' * 40}").status_code == 404
        bad = c.get("/ci/ABC")
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "sha"
        assert c.get(f"/ci/{'e' * 40}", params={"event": "tag"}).status_code == 422
        assert c.get("/sweeps/999/junit.xml").status_code == 404
        no_delivery = deliver(c, SECRET, "push", push_payload("o/r", "main", repo.commit("k")), delivery="")
        assert no_delivery.status_code == 422 and no_delivery.json()["detail"][0]["field"] == "X-GitHub-Delivery"
        assert c.get("/ci/commits").json() == []


def test_a_broker_refusal_marks_the_sweep_failed_and_lets_a_redelivery_start_over(sqlite_url, repo):
    settings = _settings(sqlite_url, repo, broker_url="redis://127.0.0.1:1/0")
    sha = repo.commit("k")
    delivery = str(uuid.uuid4())
    with make_client(settings) as c:
        first = deliver(c, SECRET, "push", push_payload("o/r", "main", sha), delivery=delivery)
        assert first.status_code == 503 and "broker refused" in first.json()["detail"]
        status = c.get(f"/ci/{sha}").json()
        assert (status["state"], status["verdict"]) == ("failed", "error") and "enqueueing failed" in status["error"]
        second = deliver(c, SECRET, "push", push_payload("o/r", "main", sha), delivery=delivery)
        assert second.status_code == 503  # not "replayed": the first attempt started nothing that runs
    with session_scope(sqlite_url) as s:
        assert s.query(Sweep).count() == 2 and s.query(CiDelivery).count() == 0
