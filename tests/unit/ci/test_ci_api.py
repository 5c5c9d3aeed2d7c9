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


def test_a_broker_refusal_keeps_the_sweep_for_the_reconciler_and_a_redelivery_is_a_replay(sqlite_url, repo):
    """The broker does not answer: the sweep is committed and accepted anyway (its configs wait
    in the outbox), a redelivery answers `replayed` with it, and the reconciler publishes it once
    a broker answers."""
    from store.db import session_factory
    from workers.outbox import Reconciler

    settings = _settings(sqlite_url, repo, broker_url="redis://127.0.0.1:1/0")
    sha = repo.commit("k")
    delivery = str(uuid.uuid4())
    with make_client(settings) as c:
        first = deliver(c, SECRET, "push", push_payload("o/r", "main", sha), delivery=delivery)
        assert first.status_code == 202 and first.json()["tasks"] == 0, first.text
        status = c.get(f"/ci/{sha}").json()
        assert (status["state"], status["verdict"]) == ("queued", "pending")
        second = deliver(c, SECRET, "push", push_payload("o/r", "main", sha), delivery=delivery)
        assert second.status_code == 200 and second.json()["status"] == "replayed"
        assert second.json()["sweep_id"] == first.json()["sweep_id"]
    with session_scope(sqlite_url) as s:
        assert s.query(Sweep).count() == 1 and s.query(CiDelivery).count() == 1
    working = settings.model_copy(update={"broker_url": "memory://"})
    assert _priorities(working) == []
    done = Reconciler(working, create_celery(working)).run_once(session_factory(sqlite_url))
    assert done["published_tasks"] >= 1
    assert set(_priorities(working)) == {CI_PRIORITY}
    # Published once: a second pass finds nothing left to publish.
    assert Reconciler(working, create_celery(working)).run_once(session_factory(sqlite_url))["published_tasks"] == 0


def test_the_same_signed_body_under_a_new_delivery_id_is_a_replay(sqlite_url, repo):
    settings = _settings(sqlite_url, repo)
    sha = repo.commit("k")
    payload = push_payload("o/r", "main", sha)
    with make_client(settings) as c:
        first = deliver(c, SECRET, "push", payload, delivery=str(uuid.uuid4()))
        again = deliver(c, SECRET, "push", payload, delivery=str(uuid.uuid4()))
        assert first.status_code == 202 and again.status_code == 200, again.text
        assert again.json()["status"] == "replayed" and again.json()["sweep_id"] == first.json()["sweep_id"]
        # Another event (another body) of the same commit is a new sweep.
        other = deliver(c, SECRET, "push", {**payload, "head_commit": {"id": sha, "message": "again"}},
                        delivery=str(uuid.uuid4()))
        assert other.status_code == 202 and other.json()["sweep_id"] != first.json()["sweep_id"]
    with session_scope(sqlite_url) as s:
        assert s.query(Sweep).count() == 2
