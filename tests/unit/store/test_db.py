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


def test_a_unit_of_work_reads_rows_as_they_are_after_each_commit_and_rolls_back_on_an_error(sqlite_url):
    import pytest

    from store import repo
    from store.db import session_scope, unit_of_work
    from store.models import Sweep

    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sid = repo.create_sweep(s, request={}, seed=1, backend="cpu", label="u", splitkv_budget=1 << 30,
                                budget_source="fallback", device=None, draws=0, filtered={}, configs=[]).id
    with unit_of_work(sqlite_url) as s:
        held = s.get(Sweep, sid)
        assert held.status == "queued"
        s.commit()
        with session_scope(sqlite_url) as other:   # another process's write, between two steps
            repo.set_status(other, sid, "running")
        assert s.get(Sweep, sid).status == "running" and held.status == "running"
        repo.set_status(s, sid, "done")   # left for the end of the unit of work to commit
    with pytest.raises(RuntimeError), unit_of_work(sqlite_url) as s:
        repo.set_status(s, sid, "failed")
        raise RuntimeError("a step broke")
    with session_scope(sqlite_url) as s:
        assert s.get(Sweep, sid).status == "done"


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
