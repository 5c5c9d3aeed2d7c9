"""CI for real: signed webhook deliveries against PostgreSQL and Redis, a local git repository as
ATTNSWEEP_KERNEL_REPO, and a real Celery worker running the commits' kernels on the cpu backend."""
from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET

import pytest
from sqlalchemy import func, select

from ci.signature import sign
from store.db import session_scope
from store.models import CiDelivery, ConfigRun, SourceBundle, Sweep
from tests.integration.conftest import REDIS_URL, start_worker, stop_worker, wait_for
from tests.unit.ci.hooks import KernelRepo, deliver, pr_payload, push_payload, with_defects

pytestmark = pytest.mark.integration

SECRET = "it-webhook-secret-7f3a"
REPO = "acme/kernels"
# Small shapes, so that a cpu worker runs a CI sweep in seconds. With seed 1 the 12 configs hold
# causal ones (which causal_off_by_one breaks) and a non-causal split_kv=4 one (which only
# floor_blocks_per_split breaks).
CI_SPEC = {"dtypes": ["f16", "f32"], "ranges": {"seq_len_k": [1, 300], "seq_len_q": [1, 8], "g": [1, 2],
                                               "num_heads_q": [1, 4], "num_heads_kv": [1, 4],
                                               "head_dim_qk": [1, 32], "head_dim_v": [1, 32]}}


def _ci_client(service, repo: KernelRepo, **overrides):  # noqa: ANN001, ANN202
    fields = dict(webhook_secret=SECRET, kernel_repo=str(repo.path), ci_samples=12, ci_backend="cpu", ci_seed=1,
                  ci_spec=CI_SPEC, task_batch_size=4)
    return service.client(**{**fields, **overrides})


def _count(url: str, model) -> int:  # noqa: ANN001
    with session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(model))


def _queued_messages(prefix: str) -> int:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    try:
        return sum(r.llen(k) for k in r.scan_iter(f"{prefix}*") if r.type(k) == b"list")
    finally:
        r.close()


def _stored(url: str) -> tuple[int, int, int]:
    return _count(url, Sweep), _count(url, CiDelivery), _count(url, SourceBundle)


def _wait_verdict(client, sha: str, worker, event: str | None = None, timeout: float = 180) -> dict:  # noqa: ANN001
    query = f"?event={event}" if event else ""

    def finished() -> dict | None:
        body = client.get(f"/ci/{sha}{query}").json()
        return body if body["state"] not in ("queued", "running") else None

    try:
        return wait_for(finished, timeout, f"the CI sweep of {sha[:12]} to finish", interval=0.3)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nworker log:\n{worker.tail()}") from None


def test_signatures_ignored_events_bad_payloads_and_replays(service, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("kernels")
    push = push_payload(REPO, "main", sha)
    with _ci_client(service, repo, webhook_secret="") as off:
        assert deliver(off, SECRET, "push", push).status_code == 503
    with _ci_client(service, repo) as c:
        refused = {
            "missing": deliver(c, None, "push", push),
            "forged": deliver(c, "not-the-secret-1234", "push", push),
            "other body": deliver(c, None, "push", push, signature=sign(SECRET, b"{}")),
            "sha1 form": deliver(c, None, "push", push, signature="sha1=" + "0" * 40),
        }
        for what, resp in refused.items():
            assert resp.status_code == 401, (what, resp.text)
            assert resp.json()["detail"][0]["field"] == "X-Hub-Signature-256", what
        assert "missing" in refused["missing"].json()["detail"][0]["rule"]

        ignored = [deliver(c, SECRET, "ping", {"zen": "hi"}), deliver(c, SECRET, "issues", {"action": "opened"}),
                   deliver(c, SECRET, "push", {**push, "deleted": True, "after": "0" * 40}),
                   deliver(c, SECRET, "push", {**push, "ref": "refs/tags/v1"}),
                   deliver(c, SECRET, "pull_request", pr_payload(REPO, 1, "f", sha, "main", sha, action="closed"))]
        assert [r.status_code for r in ignored] == [200] * 5
        assert {r.json()["status"] for r in ignored} == {"ignored"}

        bad = deliver(c, SECRET, "push", {k: v for k, v in push.items() if k != "after"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "after"
        bad_pr = deliver(c, SECRET, "pull_request", pr_payload(REPO, 1, "f", "xyz", "main", sha))
        assert bad_pr.status_code == 422 and bad_pr.json()["detail"][0]["field"] == "pull_request.head.sha"
        unknown = deliver(c, SECRET, "push", push_payload(REPO, "main", "ab" * 20))
        assert unknown.status_code == 422 and unknown.json()["detail"][0]["field"] == "after"
        assert "not in the kernel repository" in unknown.json()["detail"][0]["rule"]
        assert _stored(service.url) == (0, 0, 0) and _queued_messages(service.prefix) == 0

        delivery = str(uuid.uuid4())
        first = deliver(c, SECRET, "push", push, delivery=delivery)
        assert first.status_code == 202, first.text
        queued = _queued_messages(service.prefix)
        assert queued == first.json()["tasks"] >= 3  # 12 configs, at most 4 per task
        again = deliver(c, SECRET, "push", push, delivery=delivery)
        assert again.status_code == 200 and again.json()["status"] == "replayed"
        assert again.json()["sweep_id"] == first.json()["sweep_id"]
        assert _stored(service.url) == (1, 1, 1) and _queued_messages(service.prefix) == queued
        status = c.get(f"/ci/{sha}").json()
        assert (status["state"], status["verdict"], status["event"], status["ref"]) == ("queued", "pending", "push", "refs/heads/main")


def test_each_commit_is_swept_from_its_own_bundle_and_results_carry_its_hash(service, worker, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    first = repo.commit("kernels")
    second = repo.commit("a comment", lambda t: t + "\n// second revision\n")
    with _ci_client(service, repo) as c:
        sweeps = {}
        for sha in (first, second):
            resp = deliver(c, SECRET, "push", push_payload(REPO, "main", sha))
            assert resp.status_code == 202, resp.text
            sweeps[sha] = resp.json()
        done = {sha: _wait_verdict(c, sha, worker) for sha in (first, second)}

    hashes = {sha: sweeps[sha]["source_hash"] for sha in sweeps}
    assert hashes[first] != hashes[second]
    with session_scope(service.url) as s:
        for sha in (first, second):
            bundle = s.get(SourceBundle, hashes[sha])
            assert bundle.files["attention.hip"] == repo.show(sha, "kernels/src/attention.hip")
            assert bundle.files["hip_compat.h"] == repo.show(sha, "kernels/src/hip_compat.h")
            runs = s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweeps[sha]["sweep_id"])).all()
            assert len(runs) == 12 and {r.state for r in runs} == {"done"}
            assert {r.source_hash for r in runs} == {hashes[sha]}
            assert all(r.compiler_version and r.block_n == 32 and r.backend == "cpu" for r in runs)
            assert all(r.reproducer.startswith(f"git checkout {sha} && attnsweep verify") for r in runs)
            sweep = s.get(Sweep, sweeps[sha]["sweep_id"])
            assert (sweep.repository, sweep.ref, sweep.commit_sha, sweep.event) == (REPO, "refs/heads/main", sha, "push")
        # The unchanged local kernels and the two revisions are three different sources.
        from kernels.source import source_hash

        assert source_hash() not in hashes.values()
    assert {d["verdict"] for d in done.values()} == {"pass"}


def test_pull_request_verdict_fails_on_new_failures_only(service, worker, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    base = repo.commit("known bug on main", with_defects("causal_off_by_one"))
    same = repo.commit("only a comment", lambda t: t + "\n// nothing changes\n", branch="docs")
    repo.git("checkout", "--quiet", "main")
    worse = repo.commit("a second bug", with_defects("floor_blocks_per_split"), branch="split")
    with _ci_client(service, repo) as c:
        assert deliver(c, SECRET, "push", push_payload(REPO, "main", base)).status_code == 202
        pushed = _wait_verdict(c, base, worker)
        for number, (branch, sha) in enumerate((("docs", same), ("split", worse)), start=7):
            resp = deliver(c, SECRET, "pull_request", pr_payload(REPO, number, branch, sha, "main", base))
            assert resp.status_code == 202, resp.text
        clean = _wait_verdict(c, same, worker)
        broken = _wait_verdict(c, worse, worker)
        junit = c.get(f"/sweeps/{broken['sweep_id']}/junit.xml")
        commits = c.get("/ci/commits", params={"repository": REPO}).json()
        other_repo = c.get("/ci/commits", params={"repository": "someone/else"}).json()
        misspelt = c.get("/ci/commits", params={"repo": REPO})

    # The push is pass/fail: main's known bug fails it.
    assert pushed["verdict"] == "fail" and pushed["failures"] == pushed["new_failure_count"] > 0
    known = {f["config_hash"] for f in pushed["new_failures"]}
    # A pull request with only main's failures passes, listing them as known.
    assert clean["verdict"] == "pass" and clean["base_sweep_id"] == pushed["sweep_id"]
    assert {f["config_hash"] for f in clean["known_failures"]} == known and clean["new_failures"] == []
    # One that adds a failure fails, naming only the new one.
    assert broken["verdict"] == "fail" and broken["base_commit_sha"] == base
    assert {f["config_hash"] for f in broken["known_failures"]} == known
    new = broken["new_failures"]
    assert len(new) >= 1 and not {f["config_hash"] for f in new} & known
    assert all(f["reproducer"].startswith(f"git checkout {worse} && ") and "--defect floor_blocks_per_split" in f["reproducer"]
               for f in new)
    assert all(f["config"]["split_kv"] > 1 for f in new)  # floor_blocks_per_split only hurts split configs

    assert junit.status_code == 200 and junit.headers["content-type"].startswith("application/xml")
    suite = ET.fromstring(junit.content).find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 12 and int(suite.get("tests")) == 12
    failed = [case.find("failure") for case in cases if case.find("failure") is not None]
    assert len(failed) == int(suite.get("failures")) == broken["failures"]
    known_msgs = [f for f in failed if f.get("message").startswith("known on the base branch")]
    assert len(known_msgs) == len(known)
    assert all("reproducer: git checkout" in f.text and "metrics: {" in f.text for f in failed)

    assert [(x["commit_sha"], x["event"]) for x in commits] == [(worse, "pull_request"), (same, "pull_request"), (base, "push")]
    assert [x["verdict"] for x in commits] == ["fail", "pass", "fail"]
    assert commits[0]["failures"] == broken["failures"] and commits[0]["configs"] == 12
    assert 0 < commits[0]["failure_rate"] <= 1 and commits[0]["finished_at"] and commits[0]["state"] == "done"
    assert set(commits[0]) == {"commit_sha", "ref", "event", "sweep_id", "state", "verdict", "configs", "failures",
                               "failure_rate", "finished_at"}
    assert other_repo == []
    assert misspelt.status_code == 422 and misspelt.json()["detail"][0]["field"] == "repo"


def test_a_ci_sweep_queued_after_nightly_sweeps_runs_first(service, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("kernels")
    with _ci_client(service, repo, ci_samples=4, task_batch_size=1) as c:
        nightly = []
        for i in range(2):
            resp = c.post("/sweeps", json={"samples": 4, "seed": 10 + i, "backend": "cpu", "label": "nightly",
                                           "ranges": CI_SPEC["ranges"]})
            assert resp.status_code == 202, resp.text
            nightly.append(resp.json()["id"])
        ci = deliver(c, SECRET, "push", push_payload(REPO, "main", sha))
        assert ci.status_code == 202, ci.text
        assert _queued_messages(service.prefix) == 12  # one config per task; nothing has run yet
        late = start_worker(service, tmp_path, concurrency=1)
        try:
            _wait_verdict(c, sha, late)
            for sid in nightly:
                wait_for(lambda sid=sid: c.get(f"/sweeps/{sid}").json()["status"] == "done", 120, f"nightly sweep {sid}")
        finally:
            stop_worker(late)

    with session_scope(service.url) as s:
        finished = {sid: sorted(s.scalars(select(ConfigRun.finished_at).where(ConfigRun.sweep_id == sid)))
                    for sid in (*nightly, ci.json()["sweep_id"])}
    ci_last = finished[ci.json()["sweep_id"]][-1]
    assert all(ci_last < times[0] for sid, times in finished.items() if sid in nightly), finished
