"""The migrations own the schema: they must produce exactly what the models describe."""
from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from store.db import get_engine
from store.migrate import is_current, upgrade
from store.models import Base


def test_migrations_and_models_agree(db_url):
    upgrade(db_url)
    assert is_current(db_url)
    with get_engine(db_url).connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"


def test_fresh_database_is_not_current(sqlite_url):
    assert not is_current(sqlite_url)
