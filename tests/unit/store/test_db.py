"""The SQLite engine's settings (store/db.py)."""
from __future__ import annotations

from sqlalchemy import text

from store.db import get_engine
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
