"""Events whose code the deployment does not build: a pull request from an untrusted fork (its
status says so), another repository than the deployment's, a full_name that would reach another
repository's statuses; and the 503 of an unreadable repository, which never shows its password."""
from __future__ import annotations

import pytest

from store.db import session_scope
from store.migrate import upgrade
from store.models import Sweep
from tests.unit.api.conftest import make_client, make_settings
from tests.unit.ci.hooks import Forge, KernelRepo, deliver, pr_payload, push_payload, repo_payload

SECRET = "unit-webhook-secret-5e1d"
TOKEN = "status-token-for-untrusted-events-0123"
SMALL = {"ranges": {"seq_len_k": [1, 64], "seq_len_q": [1, 4]}}


@pytest.fixture
def forge():  # noqa: ANN201
    f = Forge()
    yield f
    f.server.shutdown()


def _client(sqlite_url, repo, forge=None, **kw):  # noqa: ANN001, ANN202
    upgrade(sqlite_url)
    status = dict(status_token=TOKEN, status_api=forge.url) if forge is not None else {}
    settings = make_settings(sqlite_url, webhook_secret=SECRET, kernel_repo=str(repo.path), ci_samples=2,
                             ci_backend="cpu", ci_spec=SMALL, **status, **kw)
    return make_client(settings)


def _sweeps(url: str) -> int:
    with session_scope(url) as s:
        return s.query(Sweep).count()


def test_a_fork_is_not_built_unless_trusted_and_its_status_says_so(sqlite_url, tmp_path, forge):
    repo = KernelRepo(tmp_path / "repo")
    base, head = repo.commit("base"), repo.commit("the fork's change")
    event = pr_payload("org/kernels", 7, "feature", head, "main", base, head_repository="mallory/kernels")
    with _client(sqlite_url, repo, forge) as c:
        resp = deliver(c, SECRET, "pull_request", event)
        assert resp.status_code == 200 and resp.json()["status"] == "ignored"
        assert "not swept: head repository not trusted" in resp.json()["reason"]
        assert "mallory/kernels" in resp.json()["reason"]
    assert _sweeps(sqlite_url) == 0
    [posted] = forge.requests
    assert posted["path"] == f"/repos/org/kernels/statuses/{head}"
    assert posted["body"]["state"] == "error"
    assert posted["body"]["description"] == "not swept: head repository not trusted"

    trusted = repo_payload("mallory/kernels")["clone_url"]
    with _client(sqlite_url, repo, forge, kernel_repositories=trusted) as c:
        assert deliver(c, SECRET, "pull_request", event).status_code == 202
    assert _sweeps(sqlite_url) == 1


def test_a_pull_request_whose_head_repository_is_gone_is_not_built(sqlite_url, tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    base, head = repo.commit("base"), repo.commit("head")
    event = pr_payload("org/kernels", 8, "feature", head, "main", base)
    event["pull_request"]["head"]["repo"] = None
    with _client(sqlite_url, repo) as c:
        resp = deliver(c, SECRET, "pull_request", event)
    assert resp.status_code == 200 and "not trusted" in resp.json()["reason"]
    assert _sweeps(sqlite_url) == 0


@pytest.mark.parametrize("full_name", ["../../../orgs/victim/x", "o/r/../../x", "o/..", "./r", "o/r?x=1", "o", "o/r/s"])
def test_a_full_name_that_is_not_owner_slash_name_is_refused(sqlite_url, tmp_path, forge, full_name):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("k")
    with _client(sqlite_url, repo, forge) as c:
        resp = deliver(c, SECRET, "push", push_payload(full_name, "main", sha))
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["field"] == "repository.full_name"
    assert forge.requests == [] and _sweeps(sqlite_url) == 0


def test_statuses_go_to_the_deployments_repository_and_other_repositories_are_ignored(sqlite_url, tmp_path, forge):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("k")
    with _client(sqlite_url, repo, forge, status_repository="org/kernels") as c:
        other = deliver(c, SECRET, "push", push_payload("victim/x", "main", sha))
        assert other.status_code == 200 and "not this deployment's (org/kernels)" in other.json()["reason"]
        assert deliver(c, SECRET, "push", push_payload("Org/Kernels", "main", sha)).status_code == 202
    assert [r["path"] for r in forge.requests] == [f"/repos/org/kernels/statuses/{sha}"]


def test_an_unreadable_repositorys_503_never_shows_its_password(sqlite_url, tmp_path, caplog):
    password = "pw-d0nt-show-me-4242"
    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, webhook_secret=SECRET, kernel_repo=f"https://bot:{password}@127.0.0.1:9/k.git",
                             kernel_repo_cache=tmp_path / "cache", ci_samples=2, ci_backend="cpu", ci_spec=SMALL)
    with make_client(settings) as c:
        resp = deliver(c, SECRET, "push", push_payload("o/k", "main", "a" * 40))
    assert resp.status_code == 503 and "https://***@127.0.0.1:9/k.git" in resp.text
    assert password not in resp.text
    assert password not in caplog.text
