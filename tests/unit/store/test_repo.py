"""Results are stored once per (sweep, config); counts come from what is stored."""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from attnconfig import parse_config
from store import repo
from store.db import session_scope
from store.migrate import upgrade
from store.models import ConfigRun

BASE = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=1, head_dim_qk=32, head_dim_v=32)


def _sweep(url: str, n: int = 3) -> tuple[int, list]:
    configs = [parse_config({**BASE, "data_seed": i}) for i in range(n)]
    with session_scope(url) as s:
        sweep = repo.create_sweep(s, request={"samples": n}, seed=7, backend="cpu", label="t", splitkv_budget=1 << 30,
                                  budget_source="fallback", device="cpu", draws=n + 2,
                                  filtered={"max_tokens": 2}, configs=configs)
        return sweep.id, configs


def test_a_stored_result_is_final_and_a_late_one_is_counted_not_written(db_url):
    upgrade(db_url)
    sweep_id, configs = _sweep(db_url)
    h = configs[0].content_hash()
    with session_scope(db_url) as s:
        assert repo.record_result(s, sweep_id, h, {"outcome": "pass", "failed_gate": None, "out_rms": 1e-4}) is True
    with session_scope(db_url) as s:   # a late run (a worker that woke after its lease) says timeout
        assert repo.record_result(s, sweep_id, h, {"outcome": "timeout", "detail": "late"}, worker="w2") is False
    with session_scope(db_url) as s:
        rows = s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id, ConfigRun.config_hash == h)).all()
        assert len(rows) == 1
        assert (rows[0].outcome, rows[0].attempts, rows[0].out_rms, rows[0].detail, rows[0].worker) == ("pass", 2, 1e-4, None, None)
        counts = repo.sweep_counts(s, sweep_id)
    assert counts["configs_total"] == 3
    assert counts["configs_done"] == 1
    assert counts["outcomes"]["pass"] == 1 and counts["outcomes"]["fail"] == 0
    assert counts["filtered"] == {"max_tokens": 2}
    with session_scope(db_url) as s:
        assert [hh for hh, _ in repo.queued_configs(s, sweep_id)] == [c.content_hash() for c in configs[1:]]


def test_result_for_unknown_config_is_refused_and_nothing_written(sqlite_url):
    upgrade(sqlite_url)
    sweep_id, _ = _sweep(sqlite_url)
    with pytest.raises(LookupError, match="has no config"):
        with session_scope(sqlite_url) as s:
            repo.record_result(s, sweep_id, "0" * 32, {"outcome": "pass"})
    with session_scope(sqlite_url) as s:
        assert s.scalar(select(func.count()).select_from(ConfigRun).where(ConfigRun.state == "done")) == 0


def test_results_stored_together_land_as_one_by_one_and_a_stranger_spoils_the_batch(db_url):
    upgrade(db_url)
    sweep_id, configs = _sweep(db_url, 4)
    h = [c.content_hash() for c in configs]
    with session_scope(db_url) as s:
        repo.record_result(s, sweep_id, h[0], {"outcome": "fail", "failed_gate": "rms", "out_rms": 0.5})
    with session_scope(db_url) as s:   # rows with different columns, one of them a late re-run
        late = repo.record_results(s, sweep_id, [(h[0], {"outcome": "pass", "failed_gate": None, "out_rms": 1e-4}, "w1"),
                                                 (h[1], {"outcome": "nan", "out_nonfinite": 3}, "w2")])
    assert late == [h[0]]
    with pytest.raises(LookupError, match="has no config " + "0" * 32):
        with session_scope(db_url) as s:
            repo.record_results(s, sweep_id, [(h[2], {"outcome": "pass"}, "w1"), ("0" * 32, {"outcome": "pass"}, "w1")])
    with session_scope(db_url) as s:
        got = {r.config_hash: (r.state, r.outcome, r.attempts, r.worker, r.out_rms, r.out_nonfinite)
               for r in s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id))}
    assert got[h[0]] == ("done", "fail", 2, None, 0.5, None)
    assert got[h[1]] == ("done", "nan", 1, "w2", None, 3)
    assert got[h[2]][0] != "done" and got[h[3]][0] != "done"   # the failed batch wrote nothing


def test_duplicate_config_in_one_sweep_is_rejected(sqlite_url):
    from sqlalchemy.exc import IntegrityError

    upgrade(sqlite_url)
    c = parse_config(BASE)
    with pytest.raises(IntegrityError):
        with session_scope(sqlite_url) as s:
            repo.create_sweep(s, request={}, seed=1, backend="cpu", label=None, splitkv_budget=1, budget_source="request",
                              device=None, draws=2, filtered={}, configs=[c, c])
