"""The embedded sweep path times what bench/sweep.py reports, and the bench runs end to end."""
import json
import os

import pytest

from store import repo
from store.db import session_scope
from store.migrate import upgrade
from workers.embedded import execute_sweep
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec


def test_every_result_carries_its_phase_times_and_store_time(sqlite_url):
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sweep_id = repo.store_plan(s, plan_sweep(SweepSpec(samples=4, seed=3, backend="cpu"), device_total_memory=None, device=None)).id
    got = []
    execute_sweep(sqlite_url, sweep_id, "cpu", on_result=got.append)
    assert len(got) == 4
    for r in got:
        if r.outcome == "not_applicable":
            continue
        for key in ("compile_s", "inputs_s", "run_s", "run_wall_s", "transfer_s", "reference_s", "verify_s",
                    "total_s", "store_s"):
            assert r.timings[key] >= 0, key
        assert r.timings["store_s"] < 5


def test_bench_sweep_runs_warm_and_cold_on_cpu(tmp_path, monkeypatch):
    from bench import sweep

    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(tmp_path / "kernels"))
    out = tmp_path / "bench.json"
    summary = sweep.main(["--backend", "cpu", "--samples", "3", "--jobs", "1", "--out", str(out)])
    saved = json.loads(out.read_text())
    for run in ("warm", "cold"):
        assert saved[run]["configs"] == 3
        assert saved[run]["configs_per_s"] > 0
        assert set(saved[run]["phases_s"]) >= {"compile", "inputs", "transfers+kernel", "reference", "verify", "store"}
    assert saved["warm"]["outcomes"] == saved["cold"]["outcomes"]
    assert summary["warm_over_cold"] > 0
    mem = saved["warm"]["memory"]
    assert mem["processes"] == 1 and mem["peak_max_mb"] >= mem["between_max_mb"] > 10


def test_bench_memory_takes_each_process_at_its_most():
    from attnconfig import parse_config
    from bench.sweep import process_memory
    from sweeps.result import ConfigResult

    c = parse_config(dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=2, num_heads_kv=1,
                          head_dim_qk=8, head_dim_v=8))

    def result(pid, peak, now):  # noqa: ANN001, ANN202
        r = ConfigResult(config=c, outcome="pass", gates={}, backend="cpu", device="cpu")
        r.timings.update(pid=pid, rss_peak_mb=peak, rss_mb=now)
        return r

    mem = process_memory([result(1.0, 500, 100), result(1.0, 900, 300), result(2.0, 400, 350), result(2.0, 450, 120)])
    assert mem == {"processes": 2, "peak_max_mb": 900, "peak_sum_mb": 1350,
                   "between_max_mb": 350, "between_sum_mb": 650}
    assert process_memory([ConfigResult(config=c, outcome="pass", gates={}, backend="cpu", device="cpu")]) is None


def test_bench_sweep_baseline_runs_between_two_warm_runs_with_its_environment(tmp_path, monkeypatch):
    from bench import sweep

    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delenv("ATTNSWEEP_BENCH_PROBE", raising=False)
    seen = []
    real_run_once = sweep.run_once

    def run_once(*args, **kwargs):
        seen.append(os.environ.get("ATTNSWEEP_BENCH_PROBE"))
        summary = real_run_once(*args, **kwargs)
        seen.append(os.environ.get("ATTNSWEEP_BENCH_PROBE"))
        return summary

    monkeypatch.setattr(sweep, "run_once", run_once)
    monkeypatch.setattr(sweep, "execute_sweep", _recording_execute(seen, sweep.execute_sweep))
    summary = sweep.main(["--backend", "cpu", "--samples", "2", "--jobs", "1", "--skip-cold",
                          "--baseline-env", "ATTNSWEEP_BENCH_PROBE=on", "--out", str(tmp_path / "b.json")])
    # warm, baseline, warm again: the variable is set only while the baseline's sweep runs
    assert seen == [None, None, None, None, "on", None, None, None, None]
    assert "ATTNSWEEP_BENCH_PROBE" not in os.environ
    for run in ("warm", "baseline", "warm_again"):
        assert summary[run]["configs"] == 2
    ab = summary["ab"]
    mean_rate = (summary["warm"]["configs_per_s"] + summary["warm_again"]["configs_per_s"]) / 2
    assert ab["throughput"] == pytest.approx(mean_rate / summary["baseline"]["configs_per_s"])
    assert set(ab["phase_speedup"]) <= set(summary["baseline"]["phases_s"])


def test_bench_sweep_rejects_a_baseline_env_without_a_value(capsys):
    from bench import sweep

    with pytest.raises(SystemExit) as exc:
        sweep.main(["--backend", "cpu", "--baseline-env", "ATTNSWEEP_BENCH_PROBE"])
    assert exc.value.code == 2
    assert "--baseline-env: 'ATTNSWEEP_BENCH_PROBE' is not VAR=VALUE" in capsys.readouterr().err


def _recording_execute(seen, execute):
    def run(*args, **kwargs):
        seen.append(os.environ.get("ATTNSWEEP_BENCH_PROBE"))
        return execute(*args, **kwargs)
    return run


def test_compare_runs_takes_the_mean_of_the_runs_around_the_baseline():
    from bench.sweep import compare_runs

    def summary(rate, inputs, reference):
        return {"configs": 10, "configs_per_s": rate, "worker_s": inputs + reference,
                "phases_s": {"inputs": inputs, "reference": reference, "store": 1.0, "compile": 0.0}}

    ab = compare_runs([summary(40.0, 2.0, 1.0), summary(60.0, 2.0, 3.0)], summary(25.0, 3.0, 1.0))
    assert ab["throughput"] == pytest.approx(2.0)
    assert ab["worker_s"] == pytest.approx(0.4)           # mean of (2 + 1)/10 and (2 + 3)/10
    assert ab["baseline_worker_s"] == pytest.approx(0.4)
    assert ab["phase_speedup"] == {"inputs": pytest.approx(1.5), "reference": pytest.approx(0.5),
                                   "store": pytest.approx(1.0)}   # compile: 0 in the baseline, left out


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
        execute_sweep(sqlite_url, sweep_id, "hip", jobs=2)
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
