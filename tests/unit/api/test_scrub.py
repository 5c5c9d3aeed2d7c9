"""No secret in any answer, stored error or log line: settings/secrets.py's scrub, walked through
every path that shows text made from a URL or a value the deployment holds."""
from __future__ import annotations

import logging

import pytest

from settings import Settings
from settings.secrets import scrub_text
from store import bisections as stored
from store.db import session_scope
from store.migrate import upgrade
from store.models import Bisection
from tests.kernel_repo import CONFIG
from tests.unit.api.conftest import make_client, make_settings
from workers.bisect import run_bisection

PASSWORD = "hunter2-0xdeadbeef"
TOKEN = "admin-secret-" + "z" * 32


@pytest.mark.parametrize("text, shown", [
    (f"fatal: unable to access 'https://bot:{PASSWORD}@git.example/k.git/'", "https://***@git.example/k.git/"),
    (f"postgresql://attnsweep:{PASSWORD}@db:5432/x", "postgresql://***@db:5432/x"),
    ("ssh://git@github.com/o/r.git", "ssh://***@github.com/o/r.git"),
    (f'"redis://:{PASSWORD}@cache/0"', '"redis://***@cache/0"'),
    ("https://git.example/k.git and /srv/kernels", "https://git.example/k.git and /srv/kernels"),
])
def test_user_info_leaves_every_url(text, shown):
    assert shown in scrub_text(text) and PASSWORD not in scrub_text(text)


def test_the_deployments_secrets_are_hidden_wherever_they_appear():
    s = Settings(api_tokens=f"ops:admin:{TOKEN}", webhook_secret="webhook-" + PASSWORD, status_token="st-" + PASSWORD,
                 kernel_repo=f"https://bot:{PASSWORD}@git.example/k.git")
    text = f"token {TOKEN}, key webhook-{PASSWORD}, status st-{PASSWORD}, bare {PASSWORD}"
    assert s.scrub(text) == "token ***, key ***, status ***, bare ***"
    assert Settings(webhook_secret="abc").scrub("abc abcd") == "abc abcd"   # too short to search for


def test_a_validation_error_never_echoes_a_secret(sqlite_url):
    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, api_tokens=f"ops:admin:{TOKEN}")
    with make_client(settings, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        resp = c.post("/sweeps", json={"samples": TOKEN, "backend": "cpu"})
        assert resp.status_code == 422 and resp.json()["detail"][0]["field"] == "samples"
        assert TOKEN not in resp.text and "***" in resp.text


def test_a_bisection_of_a_repository_with_credentials_stores_and_shows_none(sqlite_url, tmp_path):
    upgrade(sqlite_url)
    repo = f"https://bot:{PASSWORD}@127.0.0.1:9/kernels.git"
    settings = make_settings(sqlite_url, kernel_repo=repo, kernel_repo_cache=tmp_path / "repos")
    with session_scope(sqlite_url) as s:
        bid = stored.create_bisection(s, repo=repo, good="a" * 40, bad="b" * 40, backend="cpu", configs=[CONFIG],
                                      defects=[], err_ratio_gate=None, submitted_by="webhook").id
    assert run_bisection(sqlite_url, bid, settings) == "error"
    with session_scope(sqlite_url) as s:
        error = s.get(Bisection, bid).error
    assert PASSWORD not in error and "https://***@127.0.0.1:9/kernels.git" in error
    with make_client(settings) as c:
        shown = c.get(f"/bisect/{bid}")
    assert shown.status_code == 200 and PASSWORD not in shown.text
    assert shown.json()["repo"] == "https://***@127.0.0.1:9/kernels.git"


def test_log_records_are_scrubbed_whichever_logger_makes_them(sqlite_url, caplog):
    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, api_tokens=f"ops:admin:{TOKEN}")
    with make_client(settings):
        pass
    with caplog.at_level(logging.INFO):
        logging.getLogger("kombu.somewhere").warning("cannot reach postgresql://u:%s@db/x with %s", PASSWORD, TOKEN)
        try:
            raise RuntimeError(f"https://bot:{PASSWORD}@git.example failed")
        except RuntimeError:
            logging.getLogger("workers.bisect").exception("bisection failed")
    text = caplog.text
    assert PASSWORD not in text and TOKEN not in text and "postgresql://***@db/x" in text


def test_a_scrubbed_record_keeps_its_arguments_for_formatters_that_read_them(sqlite_url, caplog):
    upgrade(sqlite_url)
    with make_client(make_settings(sqlite_url, api_tokens=f"ops:admin:{TOKEN}")):
        pass
    record = logging.getLogRecordFactory()("uvicorn.access", logging.INFO, __file__, 1,
                                           '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:1", "GET", f"/x?t={TOKEN}", "1.1", 200),
                                           None)
    assert record.args == ("127.0.0.1:1", "GET", "/x?t=***", "1.1", 200)
    assert record.getMessage() == '127.0.0.1:1 - "GET /x?t=*** HTTP/1.1" 200'
