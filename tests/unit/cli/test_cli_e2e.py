"""`attnsweep` end to end, as a user runs it: a real sweep on the cpu backend, stored."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import select

from attnconfig import parse_config
from attnconfig.outcomes import OUTCOMES
from store.db import session_scope
from store.models import ConfigRun, FilterCount, Sweep

# Small sizes keep the numpy reference quick on two cores; the distribution is otherwise the default.
SMALL = ["--range", "seq_len_k=1:1024", "--range", "seq_len_q=1:256"]


def attnsweep(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def _run_and_check(url: str, tmp_path) -> dict:
    report_path = tmp_path / "report.json"
    proc = attnsweep("run", "--samples", "12", "--seed", "11", "--backend", "cpu", "--label", "e2e", "--db", url,
                     "--report-json", str(report_path), *SMALL)
    report = json.loads(report_path.read_text())
    assert set(report) >= {"sweep_id", "seed", "label", "backend", "device", "configs_run", "outcomes",
                           "not_applicable_reasons", "filtered", "wall_s", "configs_per_s"}
    assert report["seed"] == 11 and report["label"] == "e2e" and report["backend"] == "cpu"
    assert "emulation" in report["device"]
    assert report["configs_run"] == report["configs_total"] == 12
    assert report["workers"] == {"embedded": 12}
    assert set(report["outcomes"]) == set(OUTCOMES)
    assert sum(report["outcomes"].values()) == 12
    bad = {k: v for k, v in report["outcomes"].items() if k not in ("pass",) and v}
    assert not bad, f"the correct cpu emulation must pass everything: {bad}"
    assert "outcomes by dtype" in proc.stdout and "configs/s" in proc.stdout
    with session_scope(url) as s:
        sweep = s.get(Sweep, report["sweep_id"])
        assert sweep.status == "done"
        rows = s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep.id)).all()
        assert len(rows) == 12 and all(r.state == "done" and r.outcome == "pass" for r in rows)
        assert all(r.out_rms is not None and r.block_n and r.reproducer.startswith("attnsweep verify") for r in rows)
        stored_filtered = dict(s.execute(select(FilterCount.reason, FilterCount.count).where(FilterCount.sweep_id == sweep.id)).all())
        assert stored_filtered == report["filtered"]
        assert sweep.draws == 12 + sum(report["filtered"].values())
    return report


def test_run_stores_every_result_in_sqlite(sqlite_url, tmp_path):
    _run_and_check(sqlite_url, tmp_path)


@pytest.mark.integration
def test_run_stores_every_result_in_postgresql(pg_url, tmp_path):
    _run_and_check(pg_url, tmp_path)


def test_sample_json_is_deterministic_and_matches_run_sampling():
    a = json.loads(attnsweep("sample", "--samples", "30", "--seed", "5", "--json").stdout)
    b = json.loads(attnsweep("sample", "--samples", "30", "--seed", "5", "--json").stdout)
    c = json.loads(attnsweep("sample", "--samples", "30", "--seed", "6", "--json").stdout)
    assert a == b and a["configs"] != c["configs"]
    assert set(a) == {"configs", "filtered", "draws"}
    assert len(a["configs"]) == 30
    assert a["draws"] == 30 + sum(a["filtered"].values())
    for cfg in a["configs"]:
        parse_config(cfg)


def test_sample_draws_the_regimes_of_the_mix_and_guided_sampling_is_deterministic():
    equal = json.loads(attnsweep("sample", "--samples", "40", "--seed", "5", "--json", "--regimes", "sink,uniform").stdout)
    assert {c.get("data_regime") for c in equal["configs"]} == {"sink", "uniform"}
    shares = json.loads(attnsweep("sample", "--samples", "40", "--seed", "5", "--json", "--regimes",
                                  "sink=1,uniform=1").stdout)
    assert shares == equal  # NAME=SHARE with equal shares is the list of names
    guided = [json.loads(attnsweep("sample", "--samples", "20", "--seed", "5", "--json", "--coverage-guided").stdout)
              for _ in range(2)]
    plain = json.loads(attnsweep("sample", "--samples", "20", "--seed", "5", "--json").stdout)
    assert guided[0] == guided[1] and guided[0]["configs"] != plain["configs"]
    assert guided[0]["filtered"]["coverage_skipped"] > 0


def test_run_prints_coverage_and_reports_it(sqlite_url, tmp_path):
    report_path = tmp_path / "report.json"
    proc = attnsweep("run", "--samples", "6", "--seed", "3", "--backend", "cpu", "--db", sqlite_url, "--regimes",
                     "normal=1,sink=1", "--coverage-guided", "--report-json", str(report_path), *SMALL)
    report = json.loads(report_path.read_text())["coverage"]
    assert report["regimes"] == ["normal", "sink"]
    t = report["totals"]
    assert f"coverage: {t['covered']} covered, {t['rare']} rare (< 3 configs), {t['never']} never" in proc.stdout
    assert sum(c["configs"] for c in report["cells"] if c["feature"] == "dtype") == 6
    again = attnsweep("run", "--samples", "6", "--seed", "3", "--backend", "cpu", "--db", sqlite_url, "--regimes",
                      "normal=1,sink=1", "--coverage-guided", "--coverage-prior", "1", *SMALL)
    assert again.returncode == 0
    with session_scope(sqlite_url) as s:
        first, second = (sorted(s.scalars(select(ConfigRun.config_hash).where(ConfigRun.sweep_id == i))) for i in (1, 2))
        assert s.get(Sweep, 2).request["coverage_prior_sweeps"] == 1
    assert first != second  # the first sweep's cells count as covered: the second draws elsewhere


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--dtypes", "f64", "--backend", "cpu"], "dtypes"),
        (["run", "--range", "g=9:1", "--backend", "cpu"], "g"),
        (["run", "--range", "colour=1:2", "--backend", "cpu"], "colour"),
        (["run", "--backend", "tpu"], "backend"),
        (["run", "--regimes", "spiky=1", "--backend", "cpu"], "--regimes: unknown regime 'spiky'; allowed: normal"),
        (["run", "--regimes", "sink=0", "--backend", "cpu"], "--regimes: sink=0.0: a share must be a finite number > 0"),
        (["run", "--regimes", "sink=lots", "--backend", "cpu"], "--regimes: 'sink=lots': a share must be a number"),
        (["run", "--regimes", "normal,sink=0.2", "--backend", "cpu"], "give every regime a share (NAME=SHARE) or none"),
        (["run", "--regimes", ",", "--backend", "cpu"], "--regimes: ',': name at least one regime"),
        (["run", "--coverage-prior", "2", "--backend", "cpu"], "--coverage-prior: coverage_prior_sweeps=2 needs coverage_guided"),
        (["run", "--coverage-guided", "--coverage-prior", "101", "--backend", "cpu"], "--coverage-prior: "),
        (["run", "--gpus", "all", "--backend", "cpu"], "--gpus 'all': no GPU is visible"),
        (["verify", "--config", '{"dtype": "f16"}'], "g: "),
        (["verify", "--config", "{nope"], "not valid JSON"),
        (["verify", "--backend", "cpu", "--config", '{"dtype": "f16", "g": 1, "seq_len_q": 1, "seq_len_k": 64, "num_heads_q": 1, '
          '"num_heads_kv": 1, "head_dim_qk": 8, "head_dim_v": 8, "split_kv": 0}'], "split_kv: 0 (automatic) needs a GPU backend"),
    ],
)
def test_bad_input_is_a_clear_error_not_a_traceback(args, needle, tmp_path):
    proc = attnsweep(*args, "--db", str(tmp_path / "x.db"), check=False) if args[0] == "run" else attnsweep(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    assert not (tmp_path / "x.db").exists() or args[1] != "--dtypes"


def test_reproducer_reproduces_the_verdict(sqlite_url, tmp_path):
    attnsweep("run", "--samples", "3", "--seed", "2", "--backend", "cpu", "--db", sqlite_url, *SMALL)
    with session_scope(sqlite_url) as s:
        row = s.scalars(select(ConfigRun).order_by(ConfigRun.seq).limit(1)).one()
        stored = (row.outcome, row.reproducer, row.gates)
    assert "--gates" in stored[1]
    import shlex

    argv = shlex.split(stored[1])
    assert argv[:2] == ["attnsweep", "verify"]
    proc = attnsweep(*argv[1:], "--json", check=False)
    out = json.loads(proc.stdout)
    assert out["outcome"] == stored[0] and out["gates"] == stored[2]
