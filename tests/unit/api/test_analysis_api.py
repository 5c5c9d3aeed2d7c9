"""GET /sweeps/{id}/failure-rates and /sweeps/{id}/failures on stored sweeps.

The sweeps carry the planted pattern of tests/e2e/seed.py: every failure is bf16 with
split_kv >= 16 (3 rms fails, 1 row fail, 1 nan, 1 error), two f32 configs are not applicable.
"""
from __future__ import annotations

import pytest

from tests.e2e import seed
from tests.unit.api.conftest import make_client, make_settings


@pytest.fixture
def seeded(db_url):  # noqa: ANN001, ANN201
    from store.migrate import upgrade

    upgrade(db_url)
    with make_client(make_settings(db_url)) as client:
        nightly = seed.seed_finished(db_url, label="nightly")
        other = seed.seed_finished(db_url, label="weekly")
        yield client, nightly, other


@pytest.fixture
def seeded_sqlite(sqlite_url):  # noqa: ANN001, ANN201
    """For the refusals, which no database answers: the request is checked before any query."""
    from store.migrate import upgrade

    upgrade(sqlite_url)
    with make_client(make_settings(sqlite_url)) as client:
        yield client, seed.seed_finished(sqlite_url)


def _rates(client, sweep_id: int, query: str) -> dict:  # noqa: ANN001
    resp = client.get(f"/sweeps/{sweep_id}/failure-rates?{query}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_failure_rates_show_the_planted_pattern(seeded):
    client, nightly, _other = seeded
    body = _rates(client, nightly.sweep_id, "by=dtype&by=split_kv")
    assert body["by"] == ["dtype", "split_kv"]
    assert body["axes"] == {"dtype": ["bf16", "f16", "f32", "i8"], "split_kv": [1, 2, 4, 8, 16, 32]}
    rates = {(c["key"]["dtype"], c["key"]["split_kv"]): c["failure_rate"] for c in body["cells"]}
    assert len(rates) == 24
    for (dtype, split), rate in rates.items():
        assert rate == (1.0 if dtype == "bf16" and split >= 16 else 0.0), (dtype, split, rate)
    f32_32 = next(c for c in body["cells"] if c["key"] == {"dtype": "f32", "split_kv": 32})
    assert (f32_32["runs"], f32_32["outcomes"]["not_applicable"], f32_32["failures"]) == (3, 2, 0)
    # Only this sweep's results: the other sweep holds the same configs and failures.
    assert (body["runs"], body["failures"]) == (72, 6) and body["failure_rate"] == pytest.approx(6 / 70)


def test_failure_rates_by_comma_list_equal_repeated_by(seeded):
    client, nightly, _other = seeded
    assert _rates(client, nightly.sweep_id, "by=causal,dtype") == _rates(client, nightly.sweep_id, "by=causal&by=dtype")


def test_size_buckets_are_powers_of_two_and_their_filters_select_their_configs(seeded):
    client, nightly, _other = seeded
    body = _rates(client, nightly.sweep_id, "by=seq_len_k_bucket&dtype=bf16")
    cells = {c["key"]["seq_len_k_bucket"]: c for c in body["cells"]}
    assert sorted(cells) == [64, 256, 1024]
    assert [cells[k]["label"]["seq_len_k_bucket"] for k in (64, 256, 1024)] == ["64-127", "256-511", "1024-2047"]
    assert cells[256]["filter"] == {"seq_len_k": "256:511"}
    assert (cells[256]["runs"], cells[256]["failures"]) == (6, 2)  # bf16 x 6 splits at seq_len_k=300
    failures = client.get(f"/sweeps/{nightly.sweep_id}/failures", params={**cells[256]["filter"], "dtype": "bf16"}).json()
    assert {r["config"]["seq_len_k"] for r in failures["data"]} == {300} and failures["count"] == 2


def test_failure_rates_take_the_filters_of_failures_summary(seeded):
    client, nightly, _other = seeded
    body = _rates(client, nightly.sweep_id, "by=split_kv&dtype=bf16&seq_len_k=:500")
    assert {c["key"]["split_kv"]: (c["runs"], c["failures"]) for c in body["cells"]} == {
        1: (2, 0), 2: (2, 0), 4: (2, 0), 8: (2, 0), 16: (2, 2), 32: (2, 2)}
    assert _rates(client, nightly.sweep_id, "by=causal")["axes"]["causal"] == [False, True]


@pytest.mark.parametrize(
    "path, field, words",
    [
        ("failure-rates?by=colour", "by", "must be one of"),
        ("failure-rates?by=dtype&by=split_kv&by=causal", "by", "one or two fields"),
        ("failure-rates?by=dtype,dtype", "by", "must differ"),
        ("failure-rates", "by", "Field required"),
        ("failure-rates?by=dtype&colour=red", "colour", "Extra inputs"),
        ("failure-rates?by=dtype&sweep=1", "sweep", "Extra inputs"),
        ("failure-rates?by=dtype&seq_len_k=abc", "seq_len_k", "expected N, A,B,C or LO:HI"),
        ("failures?sort=config", "sort", "must be one of"),
        ("failures?dtype=f64", "dtype", "must be one of f16"),
        ("failures?outcome=pass", "outcome", "must be one of fail"),
        ("failures?split_kv=9:3", "split_kv", "lo must be <= hi"),
        ("failures?limit=5000", "limit", "less than or equal to 1000"),
        ("failures?with_count=true", "with_count", "Extra inputs"),
    ],
)
def test_bad_queries_are_422_naming_the_field_and_rule(seeded_sqlite, path, field, words):
    client, nightly = seeded_sqlite
    resp = client.get(f"/sweeps/{nightly.sweep_id}/{path}")
    assert resp.status_code == 422, resp.text
    problems = {p["field"]: p["rule"] for p in resp.json()["detail"]}
    assert field in problems and words in problems[field], problems


@pytest.mark.parametrize("path", ["failure-rates?by=dtype", "failures"])
def test_an_unknown_sweep_is_404(seeded_sqlite, path):
    client, _nightly = seeded_sqlite
    resp = client.get(f"/sweeps/999999/{path}")
    assert resp.status_code == 404 and "999999" in resp.json()["detail"]


def test_sweep_failures_carry_the_deciding_metric_its_bound_and_why(seeded):
    client, nightly, other = seeded
    body = client.get(f"/sweeps/{nightly.sweep_id}/failures?limit=100").json()
    assert body["count"] == 6 and not body["has_more"]
    assert {r["sweep_id"] for r in body["data"]} == {nightly.sweep_id}
    assert all(r["config"]["dtype"] == "bf16" and r["config"]["split_kv"] >= 16 for r in body["data"])
    checks = {(r["outcome"], r["failed_gate"]): r["check"] for r in body["data"]}
    rms = [r["check"] for r in body["data"] if r["failed_gate"] == "rms" and r["outcome"] == "fail"]
    assert sorted(c["value"] for c in rms) == pytest.approx([0.05, 0.06, 0.07])
    assert all(c["metric"] == "out_rms" and c["bound"] == 0.01 and c["why"] == "bf16 threshold" for c in rms)
    assert checks[("fail", "row")] == {"gate": "row", "metric": "out_row_err", "value": 0.5, "bound": 0.032, "why": "bf16 row bound"}
    assert checks[("nan", "rms")]["metric"] == "out_nonfinite" and checks[("nan", "rms")]["value"] == 3
    assert checks[("error", None)]["why"] == "launch failed: too many resources requested for launch"
    stored = {r.config_hash: r.reproducer for r in nightly.failures()}
    assert {r["config_hash"]: r["reproducer"] for r in body["data"]} == stored


def test_sweep_failures_filter_sort_and_page(seeded):
    client, nightly, _other = seeded
    url = f"/sweeps/{nightly.sweep_id}/failures"
    assert {r["config"]["split_kv"] for r in client.get(f"{url}?split_kv=32").json()["data"]} == {32}
    assert client.get(f"{url}?dtype=f16").json()["count"] == 0
    by_rms = client.get(f"{url}?sort=-out_rms&gate=rms&outcome=fail").json()["data"]
    assert [r["metrics"]["out_rms"] for r in by_rms] == pytest.approx([0.07, 0.06, 0.05])
    first = client.get(f"{url}?sort=seq&limit=4").json()
    rest = client.get(f"{url}?sort=seq&limit=4&offset=4").json()
    assert first["has_more"] and not rest["has_more"] and (first["count"], rest["count"]) == (6, 6)
    seqs = [r["seq"] for r in first["data"] + rest["data"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 6



def test_failure_axes_pick_the_pair_that_separates_the_failures(seeded):
    client, nightly, _ = seeded
    body = client.get(f"/sweeps/{nightly.sweep_id}/failure-axes").json()
    assert body["by"] == ["dtype", "split_kv"] and body["score"] > 0


def test_failure_axes_follow_another_planted_pattern_and_default_without_failures(db_url):
    from sqlalchemy import update

    from store.db import session_scope
    from store.migrate import upgrade
    from store.models import ConfigRun

    upgrade(db_url)
    with make_client(make_settings(db_url)) as client:
        sweep = seed.seed_finished(db_url, label="other pattern")
        with session_scope(db_url) as s:
            done = (ConfigRun.sweep_id == sweep.sweep_id) & (ConfigRun.outcome != "not_applicable")
            s.execute(update(ConfigRun).where(done).values(outcome="pass", failed_gate=None))
        clean = client.get(f"/sweeps/{sweep.sweep_id}/failure-axes").json()
        with session_scope(db_url) as s:
            s.execute(update(ConfigRun).where(done, ConfigRun.causal.is_(True), ConfigRun.seq_len_k >= 1024)
                      .values(outcome="fail", failed_gate="rms"))
        planted = client.get(f"/sweeps/{sweep.sweep_id}/failure-axes").json()
    assert clean == {"sweep_id": sweep.sweep_id, "by": ["dtype", "split_kv"], "score": None}
    assert sorted(planted["by"]) == ["causal", "seq_len_k_bucket"] and planted["score"] > 0
