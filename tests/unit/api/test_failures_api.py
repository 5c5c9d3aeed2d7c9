"""GET /failures, /failures/summary, /sweeps/{id}/results, /workers, /healthz, /metrics on stored rows."""
from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
from sqlalchemy import update

from attnconfig import parse_config
from store import repo
from store.db import session_scope
from store.models import ConfigRun
from tests.unit.api.conftest import BASE

# (dtype, split_kv, seq_len_k, outcome, gate, out_rms): 9 results over two sweeps.
ROWS_A = [
    ("f16", 1, 64, "pass", None, 1e-4),
    ("f16", 2, 128, "fail", "rms", 0.5),
    ("f16", 4, 256, "nan", "rms", math.nan),
    ("bf16", 1, 64, "pass", None, 2e-3),
    ("bf16", 2, 512, "fail", "row", math.inf),
    ("f32", 1, 64, "not_applicable", None, None),
]
ROWS_B = [
    ("f16", 1, 1024, "timeout", None, None),
    ("i8", 8, 2048, "error", None, None),
    ("i8", 1, 64, "pass", None, 1e-5),
]


def _store(url: str, label: str, rows: list[tuple], hours_ago: float) -> int:
    configs = []
    for i, (dtype, split, sk, *_rest) in enumerate(rows):
        extra = {"return_lse": True} if split > 1 else {}
        configs.append(parse_config({**BASE, "dtype": dtype, "split_kv": split, "seq_len_k": sk, "data_seed": i, **extra}))
    with session_scope(url) as s:
        sweep = repo.create_sweep(s, request={}, seed=1, backend="cpu", label=label, splitkv_budget=1, budget_source="request",
                                  device="cpu", draws=len(rows), filtered={}, configs=configs)
        sid = sweep.id
    for c, (_d, _s, _k, outcome, gate, rms) in zip(configs, rows):
        with session_scope(url) as s:
            row = {"outcome": outcome, "failed_gate": gate, "out_rms": rms, "reproducer": f"attnsweep verify --config '{c.to_json()}'",
                   "not_applicable_reason": "grid_too_large" if outcome == "not_applicable" else None, "backend": "cpu"}
            repo.record_result(s, sid, c.content_hash(), row, worker="w1")
    with session_scope(url) as s:
        s.execute(update(ConfigRun).where(ConfigRun.sweep_id == sid)
                  .values(finished_at=repo.now() - timedelta(hours=hours_ago)))
    return sid


@pytest.fixture
def stored(client, settings):  # noqa: ANN001, ANN201
    a = _store(settings.database_url, "nightly", ROWS_A, hours_ago=30)
    b = _store(settings.database_url, "weekly", ROWS_B, hours_ago=1)
    return a, b


def _strict_json(text: str):  # noqa: ANN202
    def refuse(name: str):  # noqa: ANN202
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_failures_are_every_failing_outcome_newest_first_with_reproducers(client, stored):
    resp = client.get("/failures")
    assert resp.status_code == 200
    body = _strict_json(resp.text)  # NaN / inf metrics must not make the body invalid JSON
    got = [(r["outcome"], r["label"]) for r in body["data"]]
    assert sorted(got) == sorted([("fail", "nightly"), ("nan", "nightly"), ("fail", "nightly"),
                                  ("timeout", "weekly"), ("error", "weekly")])
    assert [r["label"] for r in body["data"][:2]] == ["weekly", "weekly"]  # the newer sweep first
    assert all(r["reproducer"].startswith("attnsweep verify") for r in body["data"])
    rms = {r["config"]["seq_len_k"]: r["metrics"]["out_rms"] for r in body["data"]}
    assert rms[512] == "inf" and rms[128] == 0.5 and rms[1024] is None
    assert rms[256] is None  # SQLite stores NaN as NULL; PostgreSQL keeps it (tests/integration)


def test_non_finite_metrics_serialise_as_strings_and_back():
    from api.errors import SafeJSONResponse
    from api.schemas.common import NON_FINITE, jsonable

    body = SafeJSONResponse({"m": {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5, "e": None}}).body
    decoded = _strict_json(body.decode())
    assert decoded == {"m": {"a": "nan", "b": "inf", "c": "-inf", "d": 1.5, "e": None}}
    assert all(float(v) == NON_FINITE[v] or math.isnan(float(v)) for v in ("nan", "inf", "-inf"))
    assert jsonable([math.nan, [math.inf]]) == ["nan", ["inf"]]


@pytest.mark.parametrize(
    "query, expected_seq_len_k",
    [
        ("dtype=f16", {128, 256, 1024}),
        ("dtype=f16,bf16&split_kv=2", {128, 512}),
        ("seq_len_k=200:600", {256, 512}),
        ("seq_len_k=1000:", {1024, 2048}),
        ("seq_len_k=:128", {128}),
        ("seq_len_k=128,2048", {128, 2048}),
        ("gate=row", {512}),
        ("outcome=nan,timeout", {256, 1024}),
        ("label=weekly", {1024, 2048}),
        ("return_lse=false", {1024}),
        ("causal=true", set()),
        ("dtype=f16&gate=rms&split_kv=2:4", {128, 256}),
    ],
)
def test_failures_filter_on_config_fields_outcome_gate_and_label(client, stored, query, expected_seq_len_k):
    resp = client.get(f"/failures?{query}")
    assert resp.status_code == 200, resp.text
    assert {r["config"]["seq_len_k"] for r in resp.json()["data"]} == expected_seq_len_k


def test_failures_by_sweep_and_time_range(client, stored):
    a, b = stored
    assert {r["sweep_id"] for r in client.get(f"/failures?sweep={a}").json()["data"]} == {a}
    since = (repo.now() - timedelta(hours=2)).isoformat()
    recent = client.get("/failures", params={"since": since}).json()["data"]
    assert {r["sweep_id"] for r in recent} == {b}
    older = client.get("/failures", params={"until": since}).json()["data"]
    assert {r["sweep_id"] for r in older} == {a}


def test_failures_sort_and_pages(client, stored):
    ordered = client.get("/failures?sort=-seq_len_k").json()["data"]
    assert [r["config"]["seq_len_k"] for r in ordered] == [2048, 1024, 512, 256, 128]
    first = client.get("/failures?sort=seq_len_k&limit=2&with_count=true").json()
    second = client.get("/failures?sort=seq_len_k&limit=2&offset=2").json()
    last = client.get("/failures?sort=seq_len_k&limit=2&offset=4").json()
    assert first["count"] == 5 and first["has_more"] and second["has_more"] and not last["has_more"]
    assert [r["config"]["seq_len_k"] for r in first["data"] + second["data"] + last["data"]] == [128, 256, 512, 1024, 2048]
    assert second["count"] is None  # counting is asked for, never paid for by default
    by_rms = [r["metrics"]["out_rms"] for r in client.get("/failures?sort=-out_rms&dtype=f16,bf16").json()["data"]]
    assert by_rms[:2] == ["inf", 0.5]  # NaN and NULL sort after every number


@pytest.mark.parametrize(
    "query, field, words",
    [
        ("seq_len_k=abc", "seq_len_k", "expected N, A,B,C or LO:HI"),
        ("seq_len_k=9:3", "seq_len_k", "lo must be <= hi"),
        ("outcome=pass", "outcome", "must be one of fail, nan, fault, unsafe, error, timeout, oom"),
        ("dtype=f64", "dtype", "must be one of f16"),
        ("gate=speed", "gate", "must be one of rms"),
        ("sort=config", "sort", "must be one of"),
        ("limit=0", "limit", "greater than or equal to 1"),
        ("colour=red", "colour", "Extra inputs"),
        ("since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "until", "after since"),
    ],
)
def test_bad_failure_filters_are_422_naming_the_parameter(client, stored, query, field, words):
    resp = client.get(f"/failures?{query}")
    assert resp.status_code == 422, resp.text
    problems = {p["field"]: p["rule"] for p in resp.json()["detail"]}
    assert field in problems and words in problems[field], problems


def test_summary_counts_and_rates_by_one_and_two_fields(client, stored):
    one = client.get("/failures/summary?by=dtype").json()
    groups = {g["key"]["dtype"]: g for g in one["groups"]}
    assert (groups["f16"]["runs"], groups["f16"]["failures"]) == (4, 3)
    assert groups["f16"]["failure_rate"] == pytest.approx(3 / 4)
    assert groups["f32"]["failure_rate"] is None  # only not_applicable: nothing ran
    assert groups["i8"]["outcomes"]["error"] == 1 and groups["i8"]["outcomes"]["pass"] == 1
    assert (one["runs"], one["failures"]) == (9, 5) and one["failure_rate"] == pytest.approx(5 / 8)
    two = client.get("/failures/summary?by=dtype,split_kv&label=nightly").json()
    keys = {(g["key"]["dtype"], g["key"]["split_kv"]): (g["runs"], g["failures"]) for g in two["groups"]}
    assert keys == {("f16", 1): (1, 0), ("f16", 2): (1, 1), ("f16", 4): (1, 1), ("bf16", 1): (1, 0),
                    ("bf16", 2): (1, 1), ("f32", 1): (1, 0)}
    for bad in ("by=", "by=dtype,split_kv,causal", "by=colour", "by=dtype,dtype"):
        resp = client.get(f"/failures/summary?{bad}")
        assert resp.status_code == 422 and resp.json()["detail"][0]["field"] == "by"


def test_results_of_a_sweep_are_paged_in_sampled_order(client, stored):
    a, _b = stored
    page = client.get(f"/sweeps/{a}/results?limit=4").json()
    assert page["count"] == 6 and page["has_more"]
    assert [r["seq"] for r in page["data"]] == [0, 1, 2, 3]
    rest = client.get(f"/sweeps/{a}/results?limit=4&offset=4").json()
    assert [r["seq"] for r in rest["data"]] == [4, 5] and not rest["has_more"]
    fails = client.get(f"/sweeps/{a}/results?outcome=fail").json()
    assert fails["count"] == 2 and {r["outcome"] for r in fails["data"]} == {"fail"}
    sweep = client.get(f"/sweeps/{a}").json()
    assert sweep["outcomes"]["fail"] == 2 and sweep["not_applicable_reasons"] == {"grid_too_large": 1}
    assert sweep["configs_done"] == 6


def test_workers_health_and_metrics(client, settings):
    with session_scope(settings.database_url) as s:
        repo.register_worker(s, "gpu0@h", queue=settings.queue_name("gpu"), backend="cuda", gpu=0, concurrency=1,
                             device="H200", total_memory=141 << 30, driver_version="13.0", compiler_version="nvrtc 13",
                             arch="sm_90", versions={"python": "3.11"}, hostname="h", pid=7)
        repo.register_worker(s, "cpu@h", queue=settings.queue_name("cpu"), backend="cpu", gpu=None, concurrency=2,
                             device="cpu", total_memory=None, driver_version=None, compiler_version=None, arch=None,
                             versions={}, hostname="h", pid=8)
    with session_scope(settings.database_url) as s:
        repo.heartbeat(s, "cpu@h", stopped=True)
    workers = client.get("/workers").json()
    by_name = {w["name"]: w for w in workers["data"]}
    assert by_name["gpu0@h"]["alive"] and by_name["gpu0@h"]["total_memory"] == 141 << 30
    assert by_name["gpu0@h"]["device"] == "H200" and by_name["gpu0@h"]["versions"] == {"python": "3.11"}
    assert not by_name["cpu@h"]["alive"] and by_name["cpu@h"]["stopped_at"] is not None
    assert [w["name"] for w in client.get("/workers?alive=true").json()["data"]] == ["gpu0@h"]

    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "database": "ok", "broker": "ok"}
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert f'attnsweep_workers_alive{{queue="{settings.queue_name("gpu")}"}} 1.0' in metrics.text
    # The cpu queue's only worker stopped: its series reads 0 instead of vanishing.
    assert f'attnsweep_workers_alive{{queue="{settings.queue_name("cpu")}"}} 0.0' in metrics.text
    assert "attnsweep_stalled_seconds 0.0" in metrics.text   # no config waits
    assert 'attnsweep_http_requests_total{method="GET",route="/workers",status="200"} 2.0' in metrics.text


def test_health_is_503_when_the_schema_is_behind(tmp_path):
    from tests.unit.api.conftest import make_client, make_settings

    settings = make_settings(f"sqlite:///{tmp_path / 'empty.db'}")  # never migrated
    with make_client(settings) as c:
        resp = c.get("/healthz")
    assert resp.status_code == 503
    assert resp.json()["status"] == "unavailable" and "attnsweep db upgrade" in resp.json()["database"]
