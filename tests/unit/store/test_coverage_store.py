"""Coverage of stored sweeps (store/coverage.py, migration 0007): the data regime and the run's
numeric facts stored per config, the report of a stored sweep, the prior of the newest sweeps."""
from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from attnconfig import parse_config
from kernels import get_backend
from store import repo
from store.coverage import prior_counts, prior_sweep_ids, sweep_coverage
from store.db import get_engine, session_scope
from store.migrate import upgrade
from store.models import ConfigRun
from submit.sweep import coverage_prior
from sweeps.coverage import CellCounts, coverage_report
from sweeps.policy import gates_for
from sweeps.runner import run_config
from sweeps.sampler import sample
from sweeps.spec import parse_sweep_spec
from tests.e2e import seed

BASE = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=1, head_dim_qk=32, head_dim_v=32,
            return_lse=True)
BUDGET = 3 << 29


def _store(url: str, configs, backend: str = "cpu", request: dict | None = None) -> int:
    with session_scope(url) as s:
        return repo.create_sweep(s, request=request or {"backend": backend}, seed=1, backend=backend, label=None,
                                 splitkv_budget=BUDGET, budget_source="fallback", device="cpu", draws=len(configs),
                                 filtered={}, configs=configs).id


def _run_and_record(url: str, sweep_id: int, configs) -> list:
    be = get_backend("cpu")
    results = [run_config(c, be, gates_for(c)) for c in configs]
    be.close()
    with session_scope(url) as s:
        repo.record_results(s, sweep_id, [(r.config_hash, r.to_row(), "test") for r in results])
        repo.set_status(s, sweep_id, "done")
    return results


def test_regime_and_facts_round_trip(sqlite_url):
    upgrade(sqlite_url)
    sink = parse_config({**BASE, "data_regime": "sink", "data_seed": 1})
    normal = parse_config({**BASE, "data_seed": 2})
    sweep_id = _store(sqlite_url, [sink, normal])
    with session_scope(sqlite_url) as s:
        queued = {r.config_hash: r for r in s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id))}
        assert queued[sink.content_hash()].data_regime == "sink" and queued[normal.content_hash()].data_regime == "normal"
        assert queued[sink.content_hash()].facts is None  # not run yet
    results = _run_and_record(sqlite_url, sweep_id, [sink, normal])
    with session_scope(sqlite_url) as s:
        runs = {r.config_hash: r for r in s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id))}
        for r in results:
            stored = runs[r.config_hash]
            assert set(stored.facts) == {k for k in r.metrics if k.startswith("fact_")} and len(stored.facts) == 5
            assert stored.facts == pytest.approx({k: r.metrics[k] for k in stored.facts})
            assert stored.data_regime == r.config.data_regime
        assert parse_config(runs[sink.content_hash()].config).data_regime == "sink"


def test_migration_0007_takes_the_regime_from_the_stored_config(sqlite_url):
    upgrade(sqlite_url, "0005")
    sink = parse_config({**BASE, "data_regime": "outliers", "data_seed": 1})
    normal = parse_config({**BASE, "data_seed": 2})
    with get_engine(sqlite_url).begin() as conn:
        conn.execute(sa.text("INSERT INTO sweeps (id, status, seed, backend, request, samples, draws, configs_total, "
                             "splitkv_budget, budget_source) VALUES (1, 'done', 1, 'cpu', '{}', 2, 2, 2, 1, 'fallback')"))
        for i, c in enumerate((sink, normal)):
            cols = {k: v for k, v in repo.config_columns(c).items() if k != "data_regime"}
            cols["config"] = json.dumps(cols["config"])
            cols.update(sweep_id=1, seq=i, state="queued", attempts=0)
            conn.execute(sa.text(f"INSERT INTO config_runs ({', '.join(cols)}) VALUES ({', '.join(':' + k for k in cols)})"),
                         cols)
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        assert dict(s.execute(select(ConfigRun.config_hash, ConfigRun.data_regime)).all()) == {
            sink.content_hash(): "outliers", normal.content_hash(): "normal"}


def test_coverage_of_a_stored_cpu_sweep_is_the_report_of_its_results(sqlite_url):
    upgrade(sqlite_url)
    spec = parse_sweep_spec(dict(samples=10, seed=3, backend="cpu", data_regimes={"normal": 1, "sink": 1},
                                 ranges={"seq_len_k": (1, 512), "seq_len_q": (1, 64), "g": (1, 4)}))
    configs = sample(spec, BUDGET).configs
    sweep_id = _store(sqlite_url, configs, request=spec.model_dump(mode="json"))
    results = _run_and_record(sqlite_url, sweep_id, configs[:8])  # two stay queued: not counted
    with session_scope(sqlite_url) as s:
        stored = sweep_coverage(s, sweep_id)
    assert stored["regimes"] == ["normal", "sink"] and stored["paths"] == ["grouped", "rowwise"]
    expected = coverage_report(results, paths=stored["paths"], regimes=stored["regimes"])
    assert {k: v for k, v in stored.items() if k not in ("paths", "regimes")} == expected
    assert sum(c["configs"] for c in stored["cells"] if c["feature"] == "dtype") == 8
    assert sum(c["configs"] for c in stored["cells"] if c["feature"] == "lse") == \
        sum(1 for r in results if r.metrics.get("fact_max_abs_lse") is not None) > 0


def test_prior_is_the_newest_finished_sweeps_and_steers_the_guided_draw(sqlite_url):
    upgrade(sqlite_url)
    oldest = seed.seed_finished(sqlite_url, "oldest").sweep_id
    regimes = seed.seed_regimes(sqlite_url).sweep_id
    running = _store(sqlite_url, seed.grid()[:2])  # not finished: never a prior
    with session_scope(sqlite_url) as s:
        assert prior_sweep_ids(s, 5) == [regimes, oldest]
        assert prior_sweep_ids(s, 1) == [regimes] and prior_sweep_ids(s, 0) == []
        assert running not in prior_sweep_ids(s, 5)
        one, two = prior_counts(s, 1), prior_counts(s, 2)
        assert sum(one.configs.values()) < sum(two.configs.values())
        assert one.configs[("grouped", "sink", "dtype", "bf16")] == 6  # 24 bf16 configs, every third sink
        spec = parse_sweep_spec(dict(samples=20, seed=4, backend="cpu", coverage_guided=True, coverage_prior_sweeps=2))
        prior = coverage_prior(s, spec, None)
        assert prior.configs == two.configs
        assert coverage_prior(s, spec.model_copy(update={"coverage_guided": False}), None) is None
        assert coverage_prior(s, spec, [parse_config(BASE)]) is None  # explicit configs draw nothing

    with_prior = sample(spec, BUDGET, prior=prior)
    again = sample(spec, BUDGET, prior=prior)
    without = sample(spec, BUDGET, prior=CellCounts())
    assert [c.to_json() for c in with_prior.configs] == [c.to_json() for c in again.configs]
    assert [c.to_json() for c in with_prior.configs] != [c.to_json() for c in without.configs]
