"""Commit statuses posted to a real HTTP server standing in for GitHub's statuses API, by the API
when a CI sweep starts and by the Celery worker that finishes it; none without a token."""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration.conftest import start_worker, stop_worker, wait_for
from tests.integration.test_ci import REPO, SECRET, _ci_client, _wait_verdict
from tests.unit.ci.hooks import Forge, KernelRepo, deliver, push_payload, with_defects

pytestmark = pytest.mark.integration

TOKEN = "ghp-test-status-token-51c2"
PUBLIC = "https://attnsweep.example.org"


@pytest.fixture
def forge() -> Iterator[Forge]:
    f = Forge()
    yield f
    f.server.shutdown()


def test_statuses_posted_when_a_ci_sweep_starts_and_ends(service, forge, tmp_path):
    status_env = {"ATTNSWEEP_STATUS_TOKEN": TOKEN, "ATTNSWEEP_STATUS_API": forge.url, "ATTNSWEEP_PUBLIC_URL": PUBLIC}
    worker = start_worker(service, tmp_path, **status_env)
    try:
        repo = KernelRepo(tmp_path / "repo")
        sha = repo.commit("a known bug", with_defects("causal_off_by_one"))
        with _ci_client(service, repo, status_token=TOKEN, status_api=forge.url, public_url=PUBLIC) as c:
            started = deliver(c, SECRET, "push", push_payload(REPO, "main", sha))
            assert started.status_code == 202, started.text
            sweep_id = started.json()["sweep_id"]
            assert len(forge.requests) == 1  # posted before the webhook answered
            verdict = _wait_verdict(c, sha, worker)
            wait_for(lambda: len(forge.requests) >= 3, 120, "the final status and the one after the triage")
            triaged = c.get(f"/ci/{sha}").json()
    finally:
        stop_worker(worker)

    first, last, bugs = forge.requests
    for req in (first, last):
        assert req["path"] == f"/repos/{REPO}/statuses/{sha}"
        assert req["headers"]["Authorization"] == f"Bearer {TOKEN}"
        assert req["body"]["context"] == "attnsweep"
        assert req["body"]["target_url"] == f"{PUBLIC}/dashboard/sweeps/{sweep_id}"
    assert first["body"]["state"] == "pending"
    assert first["body"]["description"] == f"sweep {sweep_id}: 0/12 configs run"
    assert verdict["verdict"] == "fail" and verdict["failures"] > 0
    assert last["body"]["state"] == "failure"
    assert last["body"]["description"] == f"12 configs: {verdict['failures']} failing"
    # Once the worker stored the sweep's clusters, the failures are counted by bug.
    assert triaged["triage"] == "done" and triaged["bugs"] == 1 and bugs["body"]["state"] == "failure"
    failing = f"{verdict['failures']} failing config" + ("s" if verdict["failures"] != 1 else "")
    assert bugs["body"]["description"] == f"12 configs: 1 bug in {failing}" == f"12 configs: {triaged['summary']}"
    assert len(forge.requests) == 3  # at the start, at the end, after the triage; nothing per config


def test_no_status_without_a_token(service, worker, forge, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("kernels")
    with _ci_client(service, repo, status_api=forge.url) as c:
        assert deliver(c, SECRET, "push", push_payload(REPO, "main", sha)).status_code == 202
        assert _wait_verdict(c, sha, worker)["verdict"] == "pass"
    assert forge.requests == []


def test_an_unreachable_forge_does_not_fail_the_webhook(service, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("kernels")
    with _ci_client(service, repo, status_token=TOKEN, status_api="http://127.0.0.1:9") as c:
        resp = deliver(c, SECRET, "push", push_payload(REPO, "main", sha))
    assert resp.status_code == 202, resp.text
