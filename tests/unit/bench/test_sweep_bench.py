"""bench/sweep.py runs end to end on the cpu backend, as a command: a warm and a cold sweep
through the embedded path, and a baseline run between two warm ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNSWEEP_KERNEL_CACHE": str(tmp_path / "kernels")}
    return subprocess.run([sys.executable, str(ROOT / "bench/sweep.py"), "--backend", "cpu", "--jobs", "1", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_the_sweep_bench_runs_warm_and_cold_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    run = _bench(tmp_path, "--samples", "3", "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    saved = json.loads(out.read_text())
    for name in ("warm", "cold"):
        assert saved[name]["configs"] == 3
        assert saved[name]["configs_per_s"] > 0
        assert set(saved[name]["phases_s"]) >= {"compile", "inputs", "transfers+kernel", "reference", "verify",
                                                 "store"}
    assert saved["warm"]["outcomes"] == saved["cold"]["outcomes"]
    assert saved["warm_over_cold"] > 0
    # each worker process at its most: one process, its peak above what it held between configs
    mem = saved["warm"]["memory"]
    assert mem["processes"] == 1 and mem["peak_max_mb"] >= mem["between_max_mb"] > 10
    assert "warm / cold throughput" in run.stdout


@pytest.mark.timeout(300)
def test_a_baseline_runs_between_two_warm_runs_and_is_compared_with_their_mean(tmp_path):
    out = tmp_path / "b.json"
    run = _bench(tmp_path, "--samples", "2", "--skip-cold", "--baseline-env", "ATTNSWEEP_BENCH_PROBE=on",
                 "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())
    assert summary["baseline_env"] == {"ATTNSWEEP_BENCH_PROBE": "on"}
    assert "cold" not in summary
    for name in ("warm", "baseline", "warm_again"):
        assert summary[name]["configs"] == 2
    ab = summary["ab"]
    mean_rate = (summary["warm"]["configs_per_s"] + summary["warm_again"]["configs_per_s"]) / 2
    assert ab["throughput"] == pytest.approx(mean_rate / summary["baseline"]["configs_per_s"])
    assert set(ab["phase_speedup"]) <= set(summary["baseline"]["phases_s"])
    # the two warm runs' worker seconds per config, averaged
    per_config = [summary[n]["worker_s"] / summary[n]["configs"] for n in ("warm", "warm_again")]
    assert ab["worker_s"] == pytest.approx(sum(per_config) / 2)


def test_a_baseline_env_without_a_value_is_refused(tmp_path):
    run = _bench(tmp_path, "--baseline-env", "ATTNSWEEP_BENCH_PROBE")
    assert run.returncode == 2
    assert "--baseline-env: 'ATTNSWEEP_BENCH_PROBE' is not VAR=VALUE" in run.stderr


@pytest.mark.timeout(300)
def test_a_repeated_sweep_reads_the_data_cache_and_reports_the_device_share(tmp_path):
    out = tmp_path / "r.json"
    run = _bench(tmp_path, "--samples", "4", "--skip-cold", "--repeat", "--ranges", '{"seq_len_k": [1, 256]}',
                 "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())
    first, again = summary["warm"], summary["repeat"]
    assert first["outcomes"] == again["outcomes"] and again["configs"] == 4
    ran = again["data_cache"]["ran"]
    assert ran > 0 and first["data_cache"]["reference_hits"] == 0
    assert again["data_cache"]["reference_hits"] == again["data_cache"]["inputs_hits"] == ran
    assert 0 < again["device_busy"] and 0 < first["kernel_over_worker"] < 1
    assert "repeated sweep:" in run.stdout and "device busy" in run.stdout
