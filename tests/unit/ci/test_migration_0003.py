"""Revision 0003 upgrades and downgrades on SQLite and PostgreSQL, keeping the sweeps it found."""
from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from store.db import get_engine
from store.migrate import alembic_config, is_current, upgrade


def _columns(url: str, table: str) -> set[str]:
    return {c["name"] for c in inspect(get_engine(url)).get_columns(table)}


def test_0003_round_trip_keeps_existing_sweeps(db_url):
    upgrade(db_url, "0002")
    with get_engine(db_url).begin() as conn:
        conn.execute(text(
            "INSERT INTO sweeps (label, status, seed, backend, request, samples, draws, configs_total, splitkv_budget,"
            " budget_source) VALUES ('old', 'done', 1, 'cpu', '{}', 0, 0, 0, 1, 'fallback')"))
    upgrade(db_url)
    assert is_current(db_url)
    assert {"repository", "ref", "commit_sha", "event", "base_ref", "source_hash"} <= _columns(db_url, "sweeps")
    with get_engine(db_url).connect() as conn:
        assert conn.execute(text("SELECT label, source_hash, event FROM sweeps")).all() == [("old", None, None)]
    tables = set(inspect(get_engine(db_url)).get_table_names())
    assert {"source_bundles", "ci_deliveries"} <= tables

    command.downgrade(alembic_config(db_url), "0002")
    get_engine(db_url).dispose()
    assert "source_hash" not in _columns(db_url, "sweeps")
    assert not {"source_bundles", "ci_deliveries"} & set(inspect(get_engine(db_url)).get_table_names())
    with get_engine(db_url).connect() as conn:
        assert conn.execute(text("SELECT label FROM sweeps")).scalars().all() == ["old"]

    upgrade(db_url)
    assert is_current(db_url)
