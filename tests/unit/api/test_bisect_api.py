"""POST /bisect and GET /bisect/{id} on SQLite with kombu's in-memory broker, the bisection run in
this process by the worker-side function (workers.bisect.run_bisection) over the kernel
repository of tests/kernel_repo.py, whose commit DEFECT turns causal_off_by_one on."""
from __future__ import annotations

import math
from datetime import timedelta

import pytest
from sqlalchemy import update

from store import bisections as stored
from store.db import session_factory, session_scope
from store.migrate import upgrade
from store.models import Bisection
from store.repo import now
from tests.kernel_repo import COMMITS, CONFIG, DEFECT
from tests.unit.api.conftest import make_client, make_settings, published, run_queued
from workers.app import TASK_BISECT, create_celery
from workers.bisect import MAX_ATTEMPTS, run_bisection
from workers.outbox import Reconciler


@pytest.fixture
def settings(sqlite_url, kernel_repo):  # noqa: ANN001, ANN201
    """The API's settings, trusting the test's kernel repository (ATTNSWEEP_KERNEL_REPOSITORIES)."""
    upgrade(sqlite_url)
    return make_settings(sqlite_url, kernel_repositories=str(kernel_repo[0]))


def _body(repo, shas, **extra) -> dict:  # noqa: ANN001
    return {"repo": str(repo), "good": shas[0], "bad": shas[-1], "configs": [CONFIG], **extra}


def _fields(resp) -> list[str]:  # noqa: ANN001
    assert resp.status_code == 422, resp.text
    return [p["field"] for p in resp.json()["detail"]]


def test_a_posted_bisection_is_queued_for_a_worker_which_finds_the_first_bad_commit(client, settings, kernel_repo):
    repo, shas = kernel_repo
    resp = client.post("/bisect", json=_body(repo, shas))
    assert resp.status_code == 202, resp.text
    accepted = resp.json()
    assert accepted["status"] == "queued" and accepted["published"] is True
    assert accepted["queue"] == settings.queue_name("cpu") and resp.headers["location"] == f"/bisect/{accepted['id']}"
    bid = accepted["id"]
    # Nothing ran in the request: the task waits for a worker.
    queued = client.get(f"/bisect/{bid}").json()
    assert queued["status"] == "queued" and queued["first_bad"] is None and queued["tested"] == []
    tasks = published(settings)
    assert [(t["headers"]["task"], t["args"]) for t in tasks] == [(TASK_BISECT, [bid])]

    assert run_bisection(settings.database_url, bid, settings) == "done"
    done = client.get(f"/bisect/{bid}").json()
    assert done["status"] == "done" and done["error"] is None
    assert done["first_bad"] == shas[DEFECT] and done["candidates"] == [] and done["skipped"] == []
    assert done["tested"][:2] == [{"commit": shas[0], "verdict": "good"}, {"commit": shas[-1], "verdict": "bad"}]
    assert 1 <= done["steps"] <= math.ceil(math.log2(COMMITS)) and done["runs"] == len(done["tested"])
    assert (done["repo"], done["good"], done["bad"], done["backend"]) == (str(repo), shas[0], shas[-1], "cpu")
    assert done["attempts"] == 1 and done["finished_at"] is not None and (done["sweep_id"], done["cluster"]) == (None, None)

    # A second delivery of the task finds it done: nothing runs, nothing is written again.
    assert run_bisection(settings.database_url, bid, settings) == "done"
    assert client.get(f"/bisect/{bid}").json() == done


def test_refs_resolve_in_a_local_repository_and_defects_run_at_every_commit(client, settings, kernel_repo):
    repo, shas = kernel_repo
    # With the defect compiled in at every commit the good end fails: the ends bound no change.
    resp = client.post("/bisect", json=_body(repo, shas, good=shas[0][:10], bad="main", defects=["causal_off_by_one"]))
    assert resp.status_code == 202, resp.text
    assert run_queued(settings)[0] == [TASK_BISECT]
    body = client.get(f"/bisect/{resp.json()['id']}").json()
    assert body["status"] == "error" and "the good end" in body["error"] and "fails" in body["error"]
    assert body["tested"] == [{"commit": shas[0], "verdict": "bad"}] and body["first_bad"] is None


def test_a_repository_the_worker_cannot_read_is_an_error_with_the_reason(settings, kernel_repo, tmp_path):
    _repo, shas = kernel_repo
    nowhere = tmp_path / "nowhere"
    settings = settings.model_copy(update={"kernel_repositories": str(nowhere)})
    with make_client(settings) as client:
        resp = client.post("/bisect", json=_body(nowhere, shas))
        assert resp.status_code == 202
        assert run_queued(settings)[0] == [TASK_BISECT]
        body = client.get(f"/bisect/{resp.json()['id']}").json()
    assert body["status"] == "error"
    assert "cannot be read from this worker" in body["error"] and "nowhere" in body["error"]


def test_bad_requests_name_the_field_and_the_rule(client, kernel_repo):
    repo, shas = kernel_repo
    cases = {
        "configs": {"configs": []},
        "backend": {"backend": "tpu"},
        "defects.0": {"defects": ["no_such_defect"]},
        "configs.0.colour": {"configs": [{**CONFIG, "colour": "red"}]},
        "configs.0.num_heads_q": {"configs": [{**CONFIG, "num_heads_q": 3, "num_heads_kv": 2}]},
        "configs.1": {"configs": [CONFIG, CONFIG]},
        "good": {"good": "--upload-pack=touch /tmp/x"},
        "err_ratio_gate": {"err_ratio_gate": -1.0},
        "priority": {"priority": 1},
    }
    for field, change in cases.items():
        fields = _fields(client.post("/bisect", json={**_body(repo, shas), **change}))
        assert field in fields, (field, fields)
    missing = client.post("/bisect", json={"repo": str(repo), "good": shas[0], "bad": shas[-1]})
    assert _fields(missing) == ["configs"]
    same = client.post("/bisect", json=_body(repo, shas, bad=shas[0]))
    assert _fields(same) == ["bad"] and "another commit than good" in same.json()["detail"][0]["rule"]
    url = client.post("/bisect", json=_body("https://example.invalid/k.git", shas, good="main"))
    assert _fields(url) == ["good"] and "full commit id" in url.json()["detail"][0]["rule"]
    assert client.get("/bisect/999").status_code == 404
    assert _fields(client.get("/bisect/0")) == ["bisection_id"]


def test_a_worker_that_died_mid_bisection_does_not_lose_it_and_the_result_is_written_once(client, settings, kernel_repo):
    repo, shas = kernel_repo
    url = settings.database_url
    bid = client.post("/bisect", json=_body(repo, shas)).json()["id"]
    published(settings)
    # A worker claims it and dies: its heartbeat stops.
    with session_scope(url) as s:
        dead = stored.claim(s, bid, stale_after_s=60)
    assert dead == 1
    reconcile = Reconciler(settings, create_celery(settings))
    assert reconcile.run_once(session_factory(url))["bisections_published"] == 0   # its heartbeat is fresh
    assert run_bisection(url, bid, settings) == "running"                          # a redelivery: held, so nothing
    with session_scope(url) as s:
        s.execute(update(Bisection).where(Bisection.id == bid).values(heartbeat_at=now() - timedelta(hours=2)))
    assert reconcile.run_once(session_factory(url))["bisections_published"] == 1   # queued again, published
    assert client.get(f"/bisect/{bid}").json()["status"] == "queued"
    assert run_queued(settings)[0] == [TASK_BISECT]
    done = client.get(f"/bisect/{bid}").json()
    assert (done["status"], done["first_bad"], done["attempts"]) == ("done", shas[DEFECT], 2)
    # The dead worker's claim writes nothing, however late it comes back.
    with session_scope(url) as s:
        assert not stored.heartbeat(s, bid, dead, [])
        assert not stored.finish(s, bid, dead, {"first_bad": shas[0], "steps": 0, "tested": [], "runs": 0})
        assert not stored.fail(s, bid, dead, "late")
    assert client.get(f"/bisect/{bid}").json() == done


def test_a_bisection_whose_workers_keep_dying_ends_in_error(client, settings, kernel_repo):
    repo, shas = kernel_repo
    url = settings.database_url
    bid = client.post("/bisect", json=_body(repo, shas)).json()["id"]
    for _ in range(MAX_ATTEMPTS):
        with session_scope(url) as s:
            assert stored.claim(s, bid, stale_after_s=0) is not None
            s.execute(update(Bisection).where(Bisection.id == bid).values(heartbeat_at=now() - timedelta(hours=2)))
    assert run_bisection(url, bid, settings) == "error"
    body = client.get(f"/bisect/{bid}").json()
    assert body["status"] == "error" and f"{MAX_ATTEMPTS} workers ended" in body["error"]


def test_a_broker_that_refuses_leaves_the_bisection_to_the_reconciler(sqlite_url, kernel_repo):
    repo, shas = kernel_repo
    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, broker_url="redis://127.0.0.1:1/0", kernel_repositories=str(repo))
    with make_client(settings) as c:
        resp = c.post("/bisect", json=_body(repo, shas))
        assert resp.status_code == 202 and resp.json()["published"] is False
    working = settings.model_copy(update={"broker_url": "memory://"})
    done = Reconciler(working, create_celery(working)).run_once(session_factory(sqlite_url))
    assert done["bisections_published"] == 1
    assert [t["headers"]["task"] for t in published(working)] == [TASK_BISECT]


def test_only_trusted_repositories_without_credentials_are_accepted_and_nothing_is_contacted(client, kernel_repo):
    import socket
    import threading

    repo, shas = kernel_repo
    # A listener standing for an internal service: the API must refuse before any connection.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    contacted: list[str] = []

    def accept() -> None:
        try:
            contacted.append(str(listener.accept()[1]))
        except OSError:
            pass

    watcher = threading.Thread(target=accept)
    watcher.start()
    secret = "hunter2-s3cret-token"
    cases = {
        f"http://127.0.0.1:{port}/x.git": "not a repository this deployment trusts",
        f"https://bot:{secret}@example.com/k.git": "must not carry credentials",
        str(repo) + "/../" + repo.name + "-other": "not a repository this deployment trusts",
        "/etc": "not a repository this deployment trusts",
    }
    for given, rule in cases.items():
        resp = client.post("/bisect", json=_body(given, shas) | {"good": "a" * 40, "bad": "b" * 40})
        assert _fields(resp) == ["repo"], given
        assert rule in resp.json()["detail"][0]["rule"] and secret not in resp.text
    watcher.join()
    listener.close()
    assert contacted == []
    # The trusted one, named as listed (a trailing slash is the same path).
    assert client.post("/bisect", json=_body(str(repo) + "/", shas)).status_code == 202
