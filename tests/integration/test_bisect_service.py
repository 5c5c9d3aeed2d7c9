"""Bisections for real: PostgreSQL, Redis and an `attnsweep worker` subprocess, over the kernel
repository of tests/kernel_repo.py (commit DEFECT turns causal_off_by_one on). A POSTed bisection
is run by the worker and GET /bisect/{id} ends done with that commit; a CI push over the same
history has its bug (the triage's one cluster) bisected by the worker after the sweep and its
triage, and GET /ci/{sha} and the cluster end naming the first bad commit."""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration.conftest import Proc, start_worker, stop_worker, wait_for
from tests.kernel_repo import CONFIG, DEFECT
from tests.unit.ci.hooks import deliver, push_payload

pytestmark = pytest.mark.integration

SECRET = "it-webhook-secret-b15e"
REPO = "acme/kernels"
CI_SPEC = {"dtypes": ["f16", "f32"], "ranges": {"g": [1, 2], "seq_len_q": [1, 8], "seq_len_k": [1, 200],
                                               "num_heads_q": [1, 4], "num_heads_kv": [1, 4], "head_dim_qk": [8, 32],
                                               "head_dim_v": [8, 32], "split_kv": [1, 8]}}


@pytest.fixture
def repo_worker(service, tmp_path, kernel_repo) -> Iterator[Proc]:  # noqa: ANN001
    """A cpu worker that reads the kernel repository as the deployment's ATTNSWEEP_KERNEL_REPO."""
    repo, _shas = kernel_repo
    w = start_worker(service, tmp_path, ATTNSWEEP_KERNEL_REPO=str(repo), ATTNSWEEP_KERNEL_REPO_CACHE=str(tmp_path / "repos"),
                     ATTNSWEEP_TRIAGE_SHRINK_RUNS="20", ATTNSWEEP_TRIAGE_SHRINK_SECONDS="10")
    try:
        yield w
    finally:
        stop_worker(w)


def test_a_posted_bisection_is_run_by_a_worker_and_finds_the_first_bad_commit(service, repo_worker, kernel_repo):
    repo, shas = kernel_repo
    with service.client(kernel_repositories=str(repo)) as c:
        resp = c.post("/bisect", json={"repo": str(repo), "good": shas[0], "bad": shas[-1], "configs": [CONFIG]})
        assert resp.status_code == 202 and resp.json()["published"] is True, resp.text
        url = resp.json()["url"]

        def finished() -> dict | None:
            body = c.get(url).json()
            return body if body["status"] in ("done", "error") else None

        body = wait_for(finished, 120, f"the bisection to finish\n{repo_worker.tail()}", interval=0.5)
    assert body["status"] == "done", f"{body['error']}\n{repo_worker.tail()}"
    assert body["first_bad"] == shas[DEFECT] and body["attempts"] == 1
    assert body["tested"][:2] == [{"commit": shas[0], "verdict": "good"}, {"commit": shas[-1], "verdict": "bad"}]


def test_a_ci_push_over_the_defect_commit_names_it_once_bisected(service, repo_worker, kernel_repo):
    repo, shas = kernel_repo
    fields = dict(webhook_secret=SECRET, kernel_repo=str(repo), ci_samples=6, ci_backend="cpu", ci_seed=1, ci_spec=CI_SPEC)
    with service.client(**fields) as c:
        payload = {**push_payload(REPO, "main", shas[-1]), "before": shas[0]}
        resp = deliver(c, SECRET, "push", payload)
        assert resp.status_code == 202, resp.text
        seen: set[str] = set()

        def named() -> dict | None:
            body = c.get(f"/ci/{shas[-1]}").json()
            if body["summary"]:
                seen.add(body["summary"].rsplit("; ", 1)[-1])
            for bisection in body["bisections"]:
                if bisection["status"] == "error":
                    raise AssertionError(f"bisection error: {bisection['error']}\n{repo_worker.tail()}")
            return body if body["first_bad_commits"] else None

        body = wait_for(named, 240, f"the first bad commit of the push\n{repo_worker.tail()}", interval=0.3)
        clusters = c.get(f"/sweeps/{body['sweep_id']}/clusters").json()["clusters"]
    assert (body["state"], body["verdict"], body["triage"], body["bugs"]) == ("done", "fail", "done", 1)
    assert body["first_bad_commits"] == [shas[DEFECT]] and [b["status"] for b in body["bisections"]] == ["done"]
    assert body["summary"].endswith(f"first bad commit {shas[DEFECT][:12]}"), body["summary"]
    assert [(k["first_bad_commit"], k["bisection"]) for k in clusters] == [
        (shas[DEFECT], {"id": body["bisections"][0]["id"], "status": "done"})]
    print(f"\nsummaries seen while polling: {sorted(seen)}")
