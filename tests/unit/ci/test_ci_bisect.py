"""A CI push's new failures bisected for their first bad commit, one bisection per bug, on SQLite
with kombu's in-memory broker, every task run in this process as a worker runs it
(tests.unit.api.conftest.run_queued), over the kernel repositories of tests/kernel_repo.py (in
`kernel_repo` commit DEFECT turns causal_off_by_one on; in `two_bug_repo` two commits turn on
two defects)."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from typer.testing import CliRunner

from attnconfig import parse_config
from ci.notify import describe
from cli.main import app
from ci.status import commit_status
from store.db import session_scope, unit_of_work
from store.migrate import upgrade
from store.models import Sweep
from tests.kernel_repo import DEFECT, TWO_BUGS
from tests.unit.api.conftest import make_client, make_settings, run_queued
from tests.unit.ci.hooks import deliver, push_payload
from workers.app import TASK_BISECT, TASK_RUN_CONFIGS, TASK_TRIAGE
from triage.sweep import triage_sweep
from workers.bisect import plan_ci_bisections, run_bisection
from tests.unit.triage.sweeps import triage_at

SECRET = "unit-webhook-secret-5be1"
REPO = "acme/kernels"
# Six small configs (seed 1), five of them causal: the defect fails those, the clean source none.
CI_SPEC = {"dtypes": ["f16", "f32"], "ranges": {"g": [1, 2], "seq_len_q": [1, 8], "seq_len_k": [1, 200],
                                               "num_heads_q": [1, 4], "num_heads_kv": [1, 4], "head_dim_qk": [8, 32],
                                               "head_dim_v": [8, 32], "split_kv": [1, 8]}}
# Twelve configs (seed 3) over the two-bug repository: causal ones fail once causal_off_by_one
# is on, split ones (NaN in the LSE) once floor_blocks_per_split is: two clusters.
TWO_BUG_SAMPLES, TWO_BUG_SEED = 12, 3


def _settings(sqlite_url, repo, **kw):  # noqa: ANN001, ANN202
    upgrade(sqlite_url)
    fields = dict(webhook_secret=SECRET, kernel_repo=str(repo), ci_samples=6, ci_backend="cpu", ci_seed=1,
                  ci_spec=CI_SPEC, triage_shrink_runs=20, triage_shrink_seconds=10.0)
    return make_settings(sqlite_url, **{**fields, **kw})


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
        assert bisecting["bugs"] == 1 and len(bisecting["bisections"]) == 1
        assert bisecting["bisections"][0]["status"] == "queued" and bisecting["first_bad_commits"] == []
        assert bisecting["bisections"][0]["cluster"] == 0
        assert bisecting["summary"].endswith("; bisecting"), bisecting["summary"]
        with session_scope(sqlite_url) as s:
            assert describe(commit_status(s, s.get(Sweep, sweep_id), with_failures=False)).endswith("; bisecting")
        (cluster,) = c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]
        bisection_id = held[0]["args"][0]
        assert bisecting["bisections"][0]["id"] == bisection_id
        assert cluster["bisection"] == {"id": bisection_id, "status": "queued"} and cluster["first_bad_commit"] is None

        assert run_bisection(sqlite_url, bisection_id, settings) == "done"
        done = c.get(f"/ci/{shas[-1]}").json()
        assert done["first_bad_commits"] == [shas[DEFECT]] and done["bisections"][0]["status"] == "done"
        assert done["summary"].endswith(f"; first bad commit {shas[DEFECT][:12]}"), done["summary"]
        (cluster,) = c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]
        assert cluster["first_bad_commit"] == shas[DEFECT] and cluster["bisection"]["status"] == "done"
        # A second delivery of the task writes nothing again.
        assert run_bisection(sqlite_url, bisection_id, settings) == "done"
        assert c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"] == [cluster]
        with session_scope(sqlite_url) as s:
            status = describe(commit_status(s, s.get(Sweep, sweep_id), with_failures=False))
        assert f"first bad commit {shas[DEFECT][:12]}" in status
        suite = ET.fromstring(c.get(f"/sweeps/{sweep_id}/junit.xml").content).find("testsuite")
        summary = {p.get("name"): p.get("value") for p in suite.find("properties")}["attnsweep.summary"]
        assert "first bad commit" in summary

        bisection = c.get(done["bisections"][0]["url"]).json()
        # One bug (the triage's one cluster): its minimal config, shrunk from a new failure, is bisected.
        assert bisection["configs"] == [cluster["minimal_config"]] and bisection["cluster"] == 0
        assert parse_config(cluster["example_config"]).content_hash() in {f["config_hash"] for f in done["new_failures"]}
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
            assert body["verdict"] == "fail" and body["bisections"] == [] and "bisect" not in body["summary"]
        # Several commits, but every failure also failed on the sweep of `before`: none is new.
        _push(c, shas[DEFECT], shas[-1])
        assert TASK_BISECT not in run_queued(settings)[0]
        body = c.get(f"/ci/{shas[-1]}").json()
        assert body["verdict"] == "fail" and body["failures"] > 0 and body["bisections"] == []


def test_a_repository_the_worker_cannot_read_is_a_bisection_error_not_a_sweep_error(sqlite_url, kernel_repo, tmp_path):
    repo, shas = kernel_repo
    settings = _settings(sqlite_url, repo)
    worker = settings.model_copy(update={"kernel_repo": str(tmp_path / "not-here")})
    with make_client(settings) as c:
        sweep_id = _push(c, shas[0], shas[-1])
        assert TASK_BISECT not in run_queued(worker)[0]
        body = c.get(f"/ci/{shas[-1]}").json()
        (brief,) = body["bisections"]
        bisection = c.get(brief["url"]).json()
    assert (body["state"], body["verdict"], body["triage"]) == ("done", "fail", "done")
    assert body["summary"].endswith("; bisection failed") and body["first_bad_commits"] == []
    assert bisection["status"] == "error" and "cannot be read from this worker" in bisection["error"]
    assert "not-here" in bisection["error"] and bisection["sweep_id"] == sweep_id


def test_two_bugs_from_two_commits_are_bisected_each_to_its_own_first_bad_commit(sqlite_url, two_bug_repo):
    repo, shas = two_bug_repo
    first, second = sorted(TWO_BUGS)
    settings = _settings(sqlite_url, repo, ci_samples=TWO_BUG_SAMPLES, ci_seed=TWO_BUG_SEED)
    with make_client(settings) as c:
        sweep_id = _push(c, shas[0], shas[-1])
        held = run_queued(settings, hold=(TASK_BISECT,))[1]
        bisecting = c.get(f"/ci/{shas[-1]}").json()
        clusters = c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]
        assert bisecting["bugs"] == len(clusters) == 2, clusters
        # One bisection per bug, each over its own minimal config, both published by the triage's worker.
        assert [b["cluster"] for b in bisecting["bisections"]] == [0, 1]
        assert sorted(t["args"][0] for t in held) == sorted(b["id"] for b in bisecting["bisections"])
        assert bisecting["summary"].endswith("; bisecting") and bisecting["first_bad_commits"] == []
        for cluster, brief in zip(clusters, bisecting["bisections"]):
            assert cluster["bisection"] == {"id": brief["id"], "status": "queued"}
            assert c.get(brief["url"]).json()["configs"] == [cluster["minimal_config"]]
        # The causal bug is causal_off_by_one's; the other (its minimal config is not causal) the later defect's.
        expected = [shas[first] if k["minimal_config"]["causal"] else shas[second] for k in clusters]
        assert sorted(expected) == sorted([shas[first], shas[second]]), clusters

        ids = [b["id"] for b in bisecting["bisections"]]
        assert run_bisection(sqlite_url, ids[0], settings) == "done"
        half = c.get(f"/ci/{shas[-1]}").json()
        assert half["summary"].endswith(f"; first bad commit {expected[0][:12]}; bisecting"), half["summary"]
        assert run_bisection(sqlite_url, ids[1], settings) == "done"

        done = c.get(f"/ci/{shas[-1]}").json()
        assert [b["first_bad"] for b in done["bisections"]] == expected == done["first_bad_commits"]
        named = f"first bad commits {expected[0][:12]}, {expected[1][:12]}"
        assert done["summary"].endswith("; " + named), done["summary"]
        clusters = c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]
        assert [k["first_bad_commit"] for k in clusters] == expected
        assert [k["bisection"]["status"] for k in clusters] == ["done", "done"]
        with session_scope(sqlite_url) as s:
            assert describe(commit_status(s, s.get(Sweep, sweep_id), with_failures=False)).endswith(named)
        suite = ET.fromstring(c.get(f"/sweeps/{sweep_id}/junit.xml").content).find("testsuite")
        props = {p.get("name"): p.get("value") for p in suite.find("properties")}
        assert props["attnsweep.summary"].endswith(named)
        for n, sha in enumerate(expected, 1):
            assert props[f"attnsweep.bug.{n}"].endswith(f"; first bad commit {sha}")

        # `attnsweep triage` shows the stored clusters with their first bad commits, in JSON and as a table.
        got = CliRunner().invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--json"])
        assert [k["first_bad_commit"] for k in json.loads(got.stdout)["clusters"]] == expected, got.output
        got = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["triage", str(sweep_id), "--db", sqlite_url])
        assert got.exit_code == 0 and "first bad commit" in got.stdout and all(sha in got.stdout for sha in expected)

        # The triage computed again (`attnsweep triage --recompute`) starts no bisection and keeps what they found.
        assert triage_at(sqlite_url, sweep_id, settings, force=True) == "done"
        assert [k["first_bad_commit"] for k in c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]] == expected
        assert [b["id"] for b in c.get(f"/ci/{shas[-1]}").json()["bisections"]] == ids


def test_bugs_beyond_the_setting_and_failures_without_clusters_are_bisected_as_documented(sqlite_url, two_bug_repo):
    repo, shas = two_bug_repo
    settings = _settings(sqlite_url, repo, ci_samples=TWO_BUG_SAMPLES, ci_seed=TWO_BUG_SEED, ci_bisect_clusters=1)
    with make_client(settings) as c:
        sweep_id = _push(c, shas[0], shas[-1])
        assert set(run_queued(settings, hold=(TASK_TRIAGE,))[0]) == {TASK_RUN_CONFIGS}
        new = c.get(f"/ci/{shas[-1]}").json()["new_failures"]
    with session_scope(sqlite_url) as s:
        clusters = [k.to_dict() for k in triage_sweep(s, sweep_id, shrink_configs=False, classify_configs=False)]
    assert len(clusters) == 2
    # Only the largest bug; not shrunk, so over the member a shrink would start from.
    with unit_of_work(sqlite_url) as s:
        (plan,) = plan_ci_bisections(s, sweep_id, settings, clusters)
        assert (plan["cluster_rank"], plan["configs"]) == (0, [clusters[0]["example_config"]])
        assert (plan["good"], plan["bad"], plan["sweep_id"]) == (shas[0], shas[-1], sweep_id)
        # No clusters (the triage failed): one bisection, over the first new failure in sampled order.
        (plan,) = plan_ci_bisections(s, sweep_id, settings, None)
        assert (plan["cluster_rank"], plan["configs"]) == (None, [new[0]["config"]])
        assert plan_ci_bisections(s, sweep_id, settings.model_copy(update={"ci_bisect_clusters": 0}), clusters) == []
