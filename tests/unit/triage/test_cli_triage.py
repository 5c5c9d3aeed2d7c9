"""`attnsweep triage`, `shrink` and `bisect` as a user types them."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app
from tests.unit.triage.sweeps import RANGES, defect_sweep

runner = CliRunner()
BIG = dict(dtype="bf16", g=3, seq_len_q=7, seq_len_k=250, num_heads_q=4, num_heads_kv=2, head_dim_qk=40,
           head_dim_v=24, with_attn_bias=True, trans_k=True, return_lse=True, split_kv=16, data_seed=99)


def test_shrink_prints_the_minimal_config_and_its_runs(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(BIG))
    got = runner.invoke(app, ["shrink", "--config", f"@{tmp_path / 'c.json'}", "--backend", "cpu",
                              "--defect", "no_zero_sum_guard", "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert out["config"]["seq_len_k"] == 250 and out["signature"]["outcome"] == "nan"
    assert out["runs"] <= 200
    m = out["minimal_config"]
    assert (m["g"], m["num_heads_q"], m["seq_len_q"], m["seq_len_k"], m["split_kv"]) == (1, 1, 1, 1, 2)
    assert not m["with_attn_bias"] and not m["trans_k"] and m["data_seed"] == 0


def test_shrink_of_a_passing_config_exits_1():
    got = runner.invoke(app, ["shrink", "--config", json.dumps(BIG), "--backend", "cpu"])
    assert got.exit_code == 1 and "does not fail" in got.output


def test_triage_of_a_stored_sweep(sqlite_url):
    sweep_id = defect_sweep(sqlite_url, "causal_off_by_one", 60)
    got = runner.invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--json"])
    assert got.exit_code == 0, got.output
    clusters = json.loads(got.stdout)["clusters"]
    assert len(clusters) == 1
    c = clusters[0]
    assert {"size", "signature", "explanation", "minimal_config", "classification", "first_bad_commit"} <= set(c)
    assert c["explanation"]["conditions"] == ["causal=true"] and c["classification"]["kind"] == "deterministic"
    table = runner.invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--no-shrink"])
    assert table.exit_code == 0 and "causal=true" in table.stdout
    missing = runner.invoke(app, ["triage", "999", "--db", sqlite_url])
    assert missing.exit_code == 2 and "no such sweep" in missing.output


def test_triage_is_bounded_by_the_settings_unless_an_option_says_otherwise(sqlite_url, monkeypatch):
    from settings import get_settings

    sweep_id = defect_sweep(sqlite_url, "causal_off_by_one", 60)
    monkeypatch.setenv("ATTNSWEEP_TRIAGE_CLUSTERS", "0")
    get_settings.cache_clear()
    try:
        unshrunk = runner.invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--json"])
        assert unshrunk.exit_code == 0, unshrunk.output
        [c] = json.loads(unshrunk.stdout)["clusters"]
        assert c["minimal_config"] is None and c["classification"] is None and c["explanation"]["conditions"]
        bounded = runner.invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--recompute", "--max-clusters", "1",
                                      "--max-runs", "3"])
        assert bounded.exit_code == 0, bounded.output
        assert "the largest 1 clusters shrunk, at most 3 runs" in bounded.output
        [c] = json.loads(runner.invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--json"]).stdout)["clusters"]
        assert c["minimal_config"] is not None and c["runs"] - c["classification"]["runs"] <= 3   # shrink runs
    finally:
        get_settings.cache_clear()


def test_bisect_json(kernel_repo):
    from tests.kernel_repo import CONFIG, DEFECT

    repo, shas = kernel_repo
    got = runner.invoke(app, ["bisect", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1],
                              "--config", json.dumps(CONFIG), "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert out["first_bad"] == shas[DEFECT] and out["skipped"] == [] and out["steps"] <= 7


def test_run_prints_the_bugs_and_triage_shows_them_as_stored(sqlite_url, tmp_path):
    from store import clusters as stored
    from store.db import session_scope

    ranges = [f"{k}={lo}:{hi}" for k, (lo, hi) in RANGES.items()]
    args = ["run", "--db", sqlite_url, "--backend", "cpu", "--samples", "60", "--seed", "5", "--dtypes", "f16,bf16,f32,i8",
            "--defect", "causal_off_by_one", *sum((["--range", r] for r in ranges), [])]
    got = runner.invoke(app, args)
    assert got.exit_code == 1, got.output   # failing outcomes
    lines = got.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if " failing configs" in line)
    assert lines[head].startswith("1 bug in ")
    assert lines[head + 1].startswith("  1. ") and "causal=true (deterministic); reproducer: attnsweep verify" in lines[head + 1]
    with session_scope(sqlite_url) as s:
        sweep_id = max(c.sweep_id for c in s.query(stored.Cluster))
        ids = [c.id for c in stored.stored_clusters(s, sweep_id)]
    shown = runner.invoke(app, ["triage", str(sweep_id), "--db", sqlite_url, "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["status"] == "done"
    with session_scope(sqlite_url) as s:
        assert [c.id for c in stored.stored_clusters(s, sweep_id)] == ids   # shown, not recomputed
    skipped = runner.invoke(app, [*args, "--no-triage"])
    assert " failing configs" not in skipped.stdout and "triage" not in skipped.output
