"""A CI push's new failures bisected for their first bad commit, on SQLite with kombu's in-memory
broker, every task run in this process as a worker runs it (tests.unit.api.conftest.run_queued),
over the kernel repository of tests/kernel_repo.py (commit DEFECT turns causal_off_by_one on)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from attnconfig import parse_config
from ci.notify import describe
from ci.status import commit_status
from store.db import session_scope
from store.migrate import upgrade
from store.models import Sweep
from tests.kernel_repo import DEFECT
from tests.unit.api.conftest import make_client, make_settings, run_queued
from tests.unit.ci.hooks import deliver, push_payload
from workers.app import TASK_BISECT, TASK_RUN_CONFIGS, TASK_TRIAGE
from workers.bisect import run_bisection

SECRET = "unit-webhook-secret-5be1"
REPO = "acme/kernels"
# Six small configs (seed 1), five of them causal: the defect fails those, the clean source none.
CI_SPEC = {"dtypes": ["f16", "f32"], "ranges": {"g": [1, 2], "seq_len_q": [1, 8], "seq_len_k": [1, 200],
                                               "num_heads_q": [1, 4], "num_heads_kv": [1, 4], "head_dim_qk": [8, 32],
                                               "head_dim_v": [8, 32], "split_kv": [1, 8]}}


def _settings(sqlite_url, repo, **kw):  # noqa: ANN001, ANN202
    upgrade(sqlite_url)
    return make_settings(sqlite_url, webhook_secret=SECRET, kernel_repo=str(repo), ci_samples=6, ci_backend="cpu",
                         ci_seed=1, ci_spec=CI_SPEC, triage_shrink_runs=20, triage_shrink_seconds=10.0, **kw)


def _push(client, before: str | None, after: str):  # noqa: ANN001, ANN202
    payload = push_payload(REPO, "main", after)
    if before is not None:
        payload["before"] = before
    resp = deliver(client, SECRET, "push", payload)
    assert resp.status_code == 202, resp.text
    return resp.json()["sweep_id"]


def test_a_push_with_new_failures_over_several_commits_names_its_first_bad_commit(sqlite_url, kernel_repo):
    repo, shas = kernel_repo
    settings = _settings(sqlite_url, repo)
    with make_client(settings) as c:
        sweep_id = _push(c, shas[0], shas[-1])
        ran, held = run_queued(settings, hold=(TASK_BISECT,))
        assert set(ran) == {TASK_RUN_CONFIGS, TASK_TRIAGE} and ran[-1] == TASK_TRIAGE
        assert [t["headers"]["task"] for t in held] == [TASK_BISECT]   # published by the triage's worker

        bisecting = c.get(f"/ci/{shas[-1]}").json()
        assert (bisecting["state"], bisecting["verdict"], bisecting["triage"]) == ("done", "fail", "done")
        assert bisecting["bisection"]["status"] == "queued" and bisecting["first_bad_commit"] is None
        assert bisecting["summary"].endswith("; bisecting"), bisecting["summary"]
        with session_scope(sqlite_url) as s:
            assert describe(commit_status(s, s.get(Sweep, sweep_id), with_failures=False)).endswith("; bisecting")

        bisection_id = held[0]["args"][0]
        assert bisecting["bisection"]["id"] == bisection_id
        assert run_bisection(sqlite_url, bisection_id, settings) == "done"
        done = c.get(f"/ci/{shas[-1]}").json()
        assert done["first_bad_commit"] == shas[DEFECT] and done["bisection"]["status"] == "done"
        assert done["summary"].endswith(f"; first bad commit {shas[DEFECT][:12]}"), done["summary"]
        with session_scope(sqlite_url) as s:
            status = describe(commit_status(s, s.get(Sweep, sweep_id), with_failures=False))
        assert f"first bad commit {shas[DEFECT][:12]}" in status
        suite = ET.fromstring(c.get(f"/sweeps/{sweep_id}/junit.xml").content).find("testsuite")
        summary = {p.get("name"): p.get("value") for p in suite.find("properties")}["attnsweep.summary"]
        assert "first bad commit" in summary

        bisection = c.get(done["bisection"]["url"]).json()
        failing = {f["config_hash"] for f in done["new_failures"]}
        # One bug (the triage's one cluster): one of its new failures is bisected.
        assert len(bisection["configs"]) == 1 and parse_config(bisection["configs"][0]).content_hash() in failing
        assert (bisection["good"], bisection["bad"], bisection["first_bad"]) == (shas[0], shas[-1], shas[DEFECT])
        assert (bisection["repository"], bisection["commit_sha"], bisection["sweep_id"]) == (REPO, shas[-1], sweep_id)
        assert bisection["repo"] == str(repo) and bisection["backend"] == "cpu"


def test_pushes_of_one_commit_or_of_known_failures_start_no_bisection(sqlite_url, kernel_repo):
    repo, shas = kernel_repo
    settings = _settings(sqlite_url, repo)
    with make_client(settings) as c:
        # A new branch (no `before`) at the defect commit: its failures fail the push, nothing to bisect from.
        _push(c, None, shas[DEFECT])
        # One commit pushed: that commit is the first bad one, nothing to bisect.
        _push(c, shas[-2], shas[-1])
        assert TASK_BISECT not in run_queued(settings)[0]
        for sha in (shas[DEFECT], shas[-1]):
            body = c.get(f"/ci/{sha}").json()
            assert body["verdict"] == "fail" and body["bisection"] is None and "bisect" not in body["summary"]
        # Several commits, but every failure also failed on the sweep of `before`: none is new.
        _push(c, shas[DEFECT], shas[-1])
        assert TASK_BISECT not in run_queued(settings)[0]
        body = c.get(f"/ci/{shas[-1]}").json()
        assert body["verdict"] == "fail" and body["failures"] > 0 and body["bisection"] is None


def test_a_repository_the_worker_cannot_read_is_a_bisection_error_not_a_sweep_error(sqlite_url, kernel_repo, tmp_path):
    repo, shas = kernel_repo
    settings = _settings(sqlite_url, repo)
    worker = settings.model_copy(update={"kernel_repo": str(tmp_path / "not-here")})
    with make_client(settings) as c:
        sweep_id = _push(c, shas[0], shas[-1])
        assert TASK_BISECT not in run_queued(worker)[0]
        body = c.get(f"/ci/{shas[-1]}").json()
        bisection = c.get(body["bisection"]["url"]).json()
    assert (body["state"], body["verdict"], body["triage"]) == ("done", "fail", "done")
    assert body["summary"].endswith("; bisection failed") and body["first_bad_commit"] is None
    assert bisection["status"] == "error" and "cannot be read from this worker" in bisection["error"]
    assert "not-here" in bisection["error"] and bisection["sweep_id"] == sweep_id
