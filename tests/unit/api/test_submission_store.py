"""The API stores configs with one COPY on PostgreSQL: the rows must equal create_sweep's."""
from __future__ import annotations

from sqlalchemy import select

from attnconfig import parse_config
from store import repo
from store.db import session_scope
from store.migrate import upgrade
from store.models import ConfigRun
from tests.unit.api.conftest import BASE

SKIP = {"id", "sweep_id"}


def _rows(url: str, sweep_id: int) -> list[dict]:
    with session_scope(url) as s:
        runs = s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id).order_by(ConfigRun.seq)).all()
        return [{c.name: getattr(r, c.name) for c in ConfigRun.__table__.columns if c.name not in SKIP} for r in runs]


def test_bulk_insert_matches_create_sweep_on_sqlite_and_postgresql(db_url):
    upgrade(db_url)
    configs = [parse_config({**BASE, "data_seed": 1}),
               parse_config({**BASE, "causal": True, "prefix_offset": [3], "return_lse": True, "split_kv": 2}),
               parse_config({**BASE, "seq_len_q": 1, "current_seq_len": [5], "rms_threshold": 0.25, "trans_k": True})]
    common = dict(request={}, seed=1, backend="cpu", label="b", splitkv_budget=1, budget_source="request", device=None,
                  draws=3, filtered={})
    with session_scope(db_url) as s:
        reference = repo.create_sweep(s, configs=configs, **common).id
        bulk = repo.create_sweep(s, configs=[], **common).id
        repo.bulk_add_configs(s, bulk, [repo.config_columns(c) for c in configs])
    expected, got = _rows(db_url, reference), _rows(db_url, bulk)
    assert len(got) == 3
    assert got == expected
    assert [parse_config(r["config"]) for r in got] == configs
