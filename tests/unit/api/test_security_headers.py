"""What every answer carries and what every write must be (api/security.py), and the JSON depth
limit of every body (api/errors.py)."""
from __future__ import annotations

import pytest

from api.errors import MAX_JSON_DEPTH, json_depth

SMALL = {"seq_len_k": [1, 128], "seq_len_q": [1, 32]}
BODY = {"samples": 2, "backend": "cpu", "ranges": SMALL}


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/sweeps/1", "/dashboard/ci", "/docs", "/redoc", "/sweeps",
                                  "/healthz", "/sweeps/999"])
def test_every_answer_forbids_inline_script_framing_and_sniffing(client, path):
    resp = client.get(path)
    csp = resp.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'" and "unsafe-inline" not in directives["script-src"]
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert resp.headers["x-content-type-options"] == "nosniff" and resp.headers["x-frame-options"] == "DENY"
    if resp.headers["content-type"].startswith("text/html"):
        assert "<script>" not in resp.text and " onclick=" not in resp.text and " onload=" not in resp.text


@pytest.mark.parametrize("content_type, data", [
    ("application/x-www-form-urlencoded", "samples=2&backend=cpu"),
    ("multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--x--\r\n"),
    ("text/plain", '{"samples": 2, "backend": "cpu"}'),
    (None, '{"samples": 2, "backend": "cpu"}'),
])
def test_a_write_that_is_not_json_is_refused_and_stores_nothing(client, content_type, data):
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/sweeps", "/sweeps/1/cancel", "/sweeps/1/rerun", "/bisect", "/webhooks/ci"):
        resp = client.post(path, content=data.encode(), headers=headers)
        assert resp.status_code == 415, (path, resp.text)
        assert resp.json()["detail"][0]["field"] == "Content-Type"
        assert "application/json" in resp.json()["detail"][0]["rule"]
    assert client.get("/sweeps").json()["count"] == 0


def test_a_write_from_another_site_is_refused_and_one_from_this_site_goes_through(client):
    foreign = client.post("/sweeps", json=BODY, headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["detail"][0]["field"] == "Origin"
    assert client.post("/sweeps", json=BODY, headers={"Origin": "null"}).status_code == 403
    fetched = client.post("/sweeps", json=BODY, headers={"Sec-Fetch-Site": "cross-site"})
    assert fetched.status_code == 403
    assert client.get("/sweeps").json()["count"] == 0
    own = client.post("/sweeps", json=BODY, headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"})
    assert own.status_code == 202
    # A read from anywhere is a read.
    assert client.get("/sweeps", headers={"Origin": "https://evil.example"}).status_code == 200


def test_the_public_url_is_an_allowed_origin(settings):
    from tests.unit.api.conftest import make_client

    with make_client(settings.model_copy(update={"public_url": "https://attnsweep.example/"})) as c:
        assert c.post("/sweeps", json=BODY, headers={"Origin": "https://attnsweep.example"}).status_code == 202


def test_a_cross_origin_preflight_gets_no_cors_permission(client):
    resp = client.options("/sweeps", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                                              "Access-Control-Request-Headers": "content-type"})
    assert resp.status_code == 405
    assert not any(h.startswith("access-control-") for h in resp.headers)


def test_json_nested_past_the_limit_is_a_422_never_a_500(client):
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/sweeps", "/bisect", "/webhooks/ci"):
        resp = client.post(path, content=deep, headers={"Content-Type": "application/json"})
        assert resp.status_code == 422, (path, resp.status_code)
        assert resp.json()["detail"][0]["field"] == "body" and str(MAX_JSON_DEPTH) in resp.json()["detail"][0]["rule"]
    just = b"{\"a\":" * (MAX_JSON_DEPTH - 1) + b"[]" + b"}" * (MAX_JSON_DEPTH - 1)
    assert client.post("/sweeps", content=just, headers={"Content-Type": "application/json"}).status_code == 422
    assert client.post("/sweeps", content=just, headers={"Content-Type": "application/json"}).json()["detail"][0][
        "field"] != "body"


def test_json_depth_ignores_brackets_inside_strings():
    assert json_depth(b'{"a": [1, {"b": "[[[[{{"}], "c\\"[": 2}') == 3
    assert json_depth(b'"[[["') == 0 and json_depth(b"[]") == 1
