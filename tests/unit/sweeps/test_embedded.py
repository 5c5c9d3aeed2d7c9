"""The embedded sweep path: the phase times each result carries (what bench/sweep.py reports)
and the order a pool takes configs in."""

import json

import pytest

from store import repo
from store.db import session_scope, unit_of_work
from store.migrate import upgrade
from workers.embedded import execute_sweep
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec


def test_every_result_carries_its_phase_times_and_store_time(sqlite_url):
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sweep_id = repo.store_plan(s, plan_sweep(SweepSpec(samples=4, seed=3, backend="cpu"), device_total_memory=None, device=None)).id
    got = []
    with unit_of_work(sqlite_url) as session:
        execute_sweep(session, sweep_id, "cpu", on_result=got.append)
    assert len(got) == 4
    for r in got:
        if r.outcome == "not_applicable":
            continue
        for key in ("compile_s", "inputs_s", "run_s", "run_wall_s", "transfer_s", "reference_s", "verify_s",
                    "total_s", "store_s"):
            assert r.timings[key] >= 0, key
        assert r.timings["store_s"] < 5


def test_a_pool_takes_the_costliest_configs_first():
    from attnconfig import parse_config
    from workers.embedded import largest_first
    from sweeps.filters import host_cost, reference_flops

    base = dict(dtype="f16", g=1, seq_len_q=1, num_heads_q=8, num_heads_kv=8, head_dim_qk=64, head_dim_v=64)
    todo = [dict(base, seq_len_k=sk) for sk in (64, 4096, 512, 4096, 16)]
    todo[3]["with_attn_bias"] = True  # same flops as todo[1], more input to draw
    ordered = largest_first(todo)
    assert sorted(map(str, ordered)) == sorted(map(str, todo))  # a permutation: nothing lost or repeated
    assert [c["seq_len_k"] for c in ordered] == [4096, 4096, 512, 64, 16]
    assert ordered[0] is todo[3]
    costs = [host_cost(parse_config(c)) for c in ordered]
    assert costs == sorted(costs, reverse=True)
    # The drawn inputs count: a config with fewer flops but far more elements to draw costs more.
    drawn = parse_config(dict(base, seq_len_k=262144, head_dim_qk=1, head_dim_v=1))
    wide = parse_config(dict(base, seq_len_k=4096, head_dim_qk=256, head_dim_v=256, num_heads_kv=1))
    assert reference_flops(drawn) < reference_flops(wide) and host_cost(drawn) > host_cost(wide)


def test_inputs_drawn_while_the_backend_loads_give_the_same_result():
    from attnconfig import parse_config
    from kernels import get_backend
    from reference import make_inputs
    from sweeps.runner import run_config

    c = parse_config(dict(dtype="bf16", g=2, seq_len_q=3, seq_len_k=200, num_heads_q=4, num_heads_kv=2,
                          head_dim_qk=32, head_dim_v=16, split_kv=4, return_lse=True, causal=True))
    backend = get_backend("cpu")
    plain = run_config(c, backend)
    early = run_config(c, backend, drawn=(make_inputs(c), 0.25))
    assert plain.outcome == early.outcome == "pass"
    assert plain.metrics == early.metrics
    assert early.timings["inputs_s"] >= 0.25 and early.timings["total_s"] >= 0.25 + early.timings["reference_s"]


@pytest.mark.timeout(120)
def test_a_backend_that_cannot_load_in_the_pool_fails_the_sweep_with_its_error(sqlite_url):
    # hip without ROCm: the error comes back from the first task, not a pool restarting forever.
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sweep_id = repo.store_plan(s, plan_sweep(SweepSpec(samples=3, seed=3, backend="cpu"), device_total_memory=None, device=None)).id
    with pytest.raises(Exception, match="ROCm"):
        with unit_of_work(sqlite_url) as session:
            execute_sweep(session, sweep_id, "hip", jobs=2)
    with session_scope(sqlite_url) as s:
        assert repo.sweep_status(s, sweep_id) == "failed"
        assert repo.sweep_counts(s, sweep_id)["outcomes"]["pass"] == 0


def test_results_that_arrive_while_the_store_is_busy_are_written_together():
    import time

    from workers.embedded import STORE_BATCH_MAX, _results

    base = dict(dtype="f16", g=1, seq_len_q=1, num_heads_q=2, num_heads_kv=1, head_dim_qk=8, head_dim_v=8)
    todo = [dict(base, seq_len_k=16 + i) for i in range(24)]
    batches = _results(todo, "cpu", frozenset(), jobs=2)
    first = next(batches)
    time.sleep(3)  # a slow store: the pool finishes the rest meanwhile
    rest = list(batches)
    # Everything that came in during the slow store is one batch. (On a loaded machine every
    # result may be in before the first is taken: then the first batch holds them all.)
    remaining = 24 - len(first)
    assert len(first) >= 1 and (remaining == 0 or len(rest[0]) == min(remaining, STORE_BATCH_MAX))
    assert max(len(b) for b in [first, *rest]) > 1
    got = [r.config.seq_len_k for batch in [first, *rest] for r, _worker in batch]
    assert sorted(got) == [16 + i for i in range(24)]  # each config once


def test_a_repeated_sweep_takes_its_inputs_and_references_from_the_cache_and_judges_alike(sqlite_url, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv("ATTNSWEEP_DATA_CACHE", str(tmp_path / "data"))
    upgrade(sqlite_url)
    spec = SweepSpec(samples=12, seed=21, backend="cpu", ranges={"seq_len_k": [1, 512], "seq_len_q": [1, 16], "g": [1, 4]})
    runs = []
    for _ in range(2):
        with session_scope(sqlite_url) as s:
            sweep_id = repo.store_plan(s, plan_sweep(spec, device_total_memory=None, device=None)).id
        got = []
        with unit_of_work(sqlite_url) as session:
            execute_sweep(session, sweep_id, "cpu", jobs=2, on_result=got.append)
        runs.append({r.config_hash: r for r in got})
    first, second = runs
    assert first.keys() == second.keys() and len(first) == 12
    ran = [h for h, r in first.items() if r.outcome != "not_applicable"]
    assert ran
    for h, r in first.items():
        again = second[h]
        assert (again.outcome, again.failed_gate, again.detail) == (r.outcome, r.failed_gate, r.detail)
        untimed = [json.dumps(x.to_row() | {k: None for k in TIMED}, sort_keys=True, default=str) for x in (r, again)]
        assert untimed[0] == untimed[1]   # every metric bit for bit (NaN where NaN)
    assert all(first[h].timings["reference_cached"] == 0.0 for h in ran)
    assert all(second[h].timings["reference_cached"] == 1.0 and second[h].timings["inputs_cached"] == 1.0 for h in ran)
    assert list((tmp_path / "data").glob("*-reference.entry"))


TIMED = ("compile_s", "inputs_s", "run_s", "reference_s", "verify_s", "total_s")
