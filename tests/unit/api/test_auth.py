"""Who may do what (api/auth.py): closed by default, scoped tokens, reads closed on request, the
submitter recorded; the token rules checked at start."""
from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from settings import Settings
from store.migrate import upgrade
from tests.unit.api.conftest import make_client, make_settings

SMALL = {"seq_len_k": [1, 128], "seq_len_q": [1, 32]}
BODY = {"samples": 2, "backend": "cpu", "ranges": SMALL}
SECRETS = {name: f"{name}-secret-" + "x" * 32 for name in ("reader", "alice", "bob", "root")}
TOKENS = ",".join(f"{name}:{scope}:{SECRETS[name]}" for name, scope in
                  (("reader", "read"), ("alice", "submit"), ("bob", "submit"), ("root", "admin")))


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


@pytest.fixture
def scoped(sqlite_url):  # noqa: ANN001, ANN201
    upgrade(sqlite_url)
    return make_settings(sqlite_url, api_tokens=TOKENS)


def test_writes_are_closed_by_default_even_without_any_token(sqlite_url):
    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, api_tokens="")
    assert settings.auth == "on"
    with make_client(settings, headers={}) as c:
        refused = c.post("/sweeps", json=BODY)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "scope submit" in refused.json()["detail"]
        assert c.get("/sweeps").json()["count"] == 0   # nothing stored; reads open by default


def test_each_scope_does_what_it_names_and_the_submitter_is_recorded(scoped):
    with make_client(scoped, headers={}) as c:
        assert c.post("/sweeps", json=BODY).status_code == 401
        assert c.post("/sweeps", json=BODY, headers={"Authorization": "Bearer " + "y" * 40}).status_code == 403
        assert c.post("/sweeps", json=BODY, headers={"Authorization": "Basic YTpi"}).status_code == 401
        read_only = c.post("/sweeps", json=BODY, headers=bearer("reader"))
        assert read_only.status_code == 403 and read_only.json()["detail"] == (
            "the token 'reader' has scope read; this needs scope submit")
        assert c.get("/sweeps").json()["count"] == 0

        mine = c.post("/sweeps", json=BODY, headers=bearer("alice")).json()["id"]
        assert c.get(f"/sweeps/{mine}").json()["submitted_by"] == "alice"
        # Another submitter may not cancel it; its own token and an admin may.
        other = c.post(f"/sweeps/{mine}/cancel", json={}, headers=bearer("bob"))
        assert other.status_code == 403 and "alice" not in other.text and "bob" in other.text
        assert c.post(f"/sweeps/{mine}/cancel", json={}, headers=bearer("alice")).status_code == 200
        theirs = c.post("/sweeps", json=BODY, headers=bearer("bob")).json()["id"]
        assert c.post(f"/sweeps/{theirs}/cancel", json={}, headers=bearer("root")).status_code == 200
        rerun = c.post(f"/sweeps/{theirs}/rerun", json={}, headers=bearer("alice")).json()["id"]
        assert c.get(f"/sweeps/{rerun}").json()["submitted_by"] == "alice"
        listed = {s["id"]: s["submitted_by"] for s in c.get("/sweeps").json()["data"]}
        assert listed == {mine: "alice", theirs: "bob", rerun: "alice"}


def test_read_auth_closes_every_read_but_health_the_page_shells_and_the_docs(scoped):
    settings = scoped.model_copy(update={"read_auth": True})
    with make_client(settings, headers={}) as c:
        for path in ("/sweeps", "/sweeps/1", "/failures", "/failures/summary", "/workers", "/metrics", "/bisect/1",
                     "/ci/commits", "/sweeps/1/junit.xml", "/sweeps/1/failure-rates?by=dtype"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=bearer("reader")).status_code != 401, path
        assert c.get("/sweeps", headers=bearer("reader")).status_code == 200
        assert c.get("/sweeps", headers={"Authorization": "Bearer " + "z" * 40}).status_code == 403
        for path in ("/healthz", "/dashboard", "/dashboard/sweeps/1", "/dashboard/static/common.js", "/docs",
                     "/docs/init.js", "/redoc", "/openapi.json"):
            assert c.get(path).status_code == 200, path


def test_auth_off_opens_everything_and_says_so_loudly(sqlite_url, caplog):
    upgrade(sqlite_url)
    with caplog.at_level(logging.WARNING, logger="api.main"):
        settings = make_settings(sqlite_url, auth="off", api_tokens="", read_auth=True)
        with make_client(settings, headers={}) as c:
            sid = c.post("/sweeps", json=BODY).json()["id"]
            assert c.get(f"/sweeps/{sid}").json()["submitted_by"] is None
            assert c.post(f"/sweeps/{sid}/cancel", json={}).status_code == 200
            assert 'id="auth-off"' in c.get("/dashboard").text
    assert any("ATTNSWEEP_AUTH=off" in r.getMessage() for r in caplog.records)


def test_the_auth_off_notice_is_absent_when_auth_is_on(client):
    assert 'id="auth-off"' not in client.get("/dashboard").text


@pytest.mark.parametrize("tokens, rule", [
    ("ci:submit:" + "s" * 31, "at least 32"),
    ("ci:submit:changethis", "placeholder"),
    ("just-a-secret-" + "s" * 40, "not name:scope:secret"),
    ("ci:owner:" + "s" * 40, "scope 'owner' is not one of admin, submit, read"),
    ("c i:submit:" + "s" * 40, "the name must be"),
    (f"ci:submit:{'a' * 40},ci:read:{'b' * 40}", "used twice"),
    (f"ci:submit:{'a' * 40},cd:read:{'a' * 40}", "the secret of another token"),
])
def test_weak_or_malformed_tokens_are_refused_at_start_without_echoing_them(tokens, rule):
    with pytest.raises(ValidationError) as caught:
        Settings(api_tokens=tokens)
    text = str(caught.value)
    assert rule in text
    for secret in (p.rsplit(":", 1)[-1] for p in tokens.split(",")):
        if len(secret) >= 8:
            assert secret not in text


def test_a_bisection_records_its_submitter(scoped, kernel_repo):
    from tests.kernel_repo import CONFIG

    repo, shas = kernel_repo
    settings = scoped.model_copy(update={"kernel_repositories": str(repo)})
    with make_client(settings, headers=bearer("bob")) as c:
        resp = c.post("/bisect", json={"repo": str(repo), "good": shas[0], "bad": shas[-1], "configs": [CONFIG]})
        assert resp.status_code == 202, resp.text
        assert c.get(f"/bisect/{resp.json()['id']}").json()["submitted_by"] == "bob"
