"""The engines of store/db.py: SQLite's settings, pools across fork."""
from __future__ import annotations

import os

from sqlalchemy import text

from store.db import get_engine, session_scope
from store.migrate import upgrade


def test_sqlite_store_uses_wal_and_syncs_at_checkpoints(sqlite_url):
    upgrade(sqlite_url)
    with get_engine(sqlite_url).connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL, not FULL (2)
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1


def _backend_pid(url: str) -> int:
    with session_scope(url) as s:
        return int(s.scalar(text("SELECT pg_backend_pid()")))


def test_a_forked_child_opens_its_own_connection_and_leaves_its_parents_open(pg_url):
    # As in a Celery worker: the main process's reconciler leaves an idle connection in the
    # pool, then the pool forks a child that stores results through the same engine.
    parent = _backend_pid(pg_url)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.write(write, str(_backend_pid(pg_url)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert child and int(child) != parent, "the child used its parent's server session"
    # The child dropped the inherited connection without closing it: the parent's pool still
    # hands out the same session.
    assert _backend_pid(pg_url) == parent
