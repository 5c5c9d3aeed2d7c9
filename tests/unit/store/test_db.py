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
