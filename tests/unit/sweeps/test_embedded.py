"""The embedded sweep path times what bench/sweep.py reports, and the bench runs end to end."""
import json

from store.db import session_scope
from store.migrate import upgrade
from sweeps.embedded import execute_sweep
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec


def test_every_result_carries_its_phase_times_and_store_time(sqlite_url):
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sweep_id, _ = plan_sweep(s, SweepSpec(samples=4, seed=3, backend="cpu"), device_total_memory=None, device=None)
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
