"""POST /sweeps and friends on SQLite with the in-memory broker: validation, auth, budget, enqueue."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from store import repo
from store.db import session_scope
from store.models import ConfigRun, Sweep
from tests.unit.api.conftest import BASE, make_client, make_settings, published

SMALL = {"seq_len_k": [1, 128], "seq_len_q": [1, 32]}
GIB = 1 << 30


def _count(url: str, model=Sweep) -> int:  # noqa: ANN001
    with session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(model))


def _problems(resp) -> dict[str, str]:  # noqa: ANN001
    body = resp.json()
    return {p["field"]: p["rule"] for p in body["detail"]}


def test_sampled_sweep_is_stored_and_every_config_enqueued_once(client, settings):
    from sweeps.sampler import sample
    from sweeps.spec import SweepSpec

    resp = client.post("/sweeps", json={"samples": 30, "seed": 5, "backend": "cpu", "label": "u", "ranges": SMALL})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert resp.headers["location"] == f"/sweeps/{body['id']}"
    assert body["configs_total"] == 30 and body["queue"] == settings.queue_name("cpu")
    assert body["budget_source"] == "fallback" and body["splitkv_budget"] == 3 * GIB // 2
    # The API stores exactly what the sampler draws for the same request and seed.
    expected = sample(SweepSpec(samples=30, seed=5, backend="cpu", ranges=SMALL), 3 * GIB // 2)
    with session_scope(settings.database_url) as s:
        stored = [c for _h, c in repo.queued_configs(s, body["id"])]
    assert stored == [c.to_dict() for c in expected.configs]
    assert body["filtered"] == expected.filtered and body["draws"] == expected.draws

    tasks = published(settings, "cpu")
    assert len(tasks) == body["tasks"]
    hashes = [h for t in tasks for h, _c in t["args"][1]]
    assert sorted(hashes) == sorted(c.content_hash() for c in expected.configs)
    assert all(t["args"][0] == body["id"] and t["args"][2] == "cpu" for t in tasks)
    assert all(len(t["args"][1]) <= settings.task_batch_size for t in tasks)
    assert published(settings, "gpu") == []


def test_gpu_backends_go_to_the_gpu_queue(client, settings):
    resp = client.post("/sweeps", json={"samples": 3, "seed": 1, "backend": "auto", "ranges": SMALL})
    assert resp.status_code == 202
    assert resp.json()["queue"] == settings.queue_name("gpu")
    assert sum(len(t["args"][1]) for t in published(settings, "gpu")) == 3
    assert published(settings, "cpu") == []


def test_read_sweep_has_spec_names_before_anything_ran(client):
    sid = client.post("/sweeps", json={"samples": 4, "seed": 2, "backend": "cpu", "ranges": SMALL}).json()["id"]
    sweep = client.get(f"/sweeps/{sid}").json()
    for key in ("id", "status", "configs_total", "configs_done", "outcomes", "not_applicable_reasons", "filtered",
                "created_at", "started_at", "finished_at", "throughput"):
        assert key in sweep
    assert (sweep["status"], sweep["configs_total"], sweep["configs_done"]) == ("queued", 4, 0)
    assert sweep["throughput"] is None and sweep["started_at"] is None
    listing = client.get("/sweeps").json()
    assert listing["count"] == 1 and listing["data"][0]["id"] == sid
    assert client.get("/sweeps/999").status_code == 404


def test_regression_set_runs_the_given_configs_without_sampling(client, settings):
    configs = [{**BASE, "data_seed": i} for i in range(3)]
    resp = client.post("/sweeps", json={"configs": configs, "backend": "cpu", "label": "reg"})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["configs_total"] == 3 and body["draws"] == 0 and body["filtered"] == {}
    results = client.get(f"/sweeps/{body['id']}/results").json()
    assert [r["config"]["data_seed"] for r in results["data"]] == [0, 1, 2]
    assert {r["state"] for r in results["data"]} == {"queued"}
    assert client.get(f"/sweeps/{body['id']}").json()["request"]["configs"] == 3


@pytest.mark.parametrize(
    "payload, field, words",
    [
        ({"samples": 0}, "samples", "greater than or equal to 1"),
        ({"samples": 2, "dtypes": ["f64"]}, "dtypes.0", "f16"),
        ({"samples": 2, "frobnicate": 1}, "frobnicate", "Extra inputs"),
        ({"samples": 2, "ranges": {"g": [8, 2]}}, "ranges.g", "lo must be <= hi"),
        ({"configs": [BASE, {**BASE, "num_heads_q": 6, "num_heads_kv": 4}]}, "configs.1.num_heads_q",
         "num_heads_q=6 is not a multiple of num_heads_kv=4"),
        ({"configs": [{**BASE, "split_kv": 2}]}, "configs.0.split_kv", "requires return_lse"),
        ({"configs": [BASE, BASE]}, "configs.1", "repeats configs.0"),
        ({"configs": [BASE], "samples": 3}, "samples", "not both"),
        ({"samples": 2, "defects": ["no_such_bug"]}, "defects.0", "no_neginf_guard"),
        ({"samples": 5, "ranges": {"seq_len_k": [16384, 16384], "g": [256, 256]}, "max_draws": 20}, "max_draws",
         "cap of 20 draws"),
    ],
)
def test_bad_sweep_request_is_422_naming_field_and_rule_and_writes_nothing(client, settings, payload, field, words):
    resp = client.post("/sweeps", json=payload)
    assert resp.status_code == 422, resp.text
    problems = _problems(resp)
    assert field in problems, problems
    assert words in problems[field]
    assert _count(settings.database_url) == 0
    assert published(settings) == []


def test_malformed_json_is_422_on_body(client):
    resp = client.post("/sweeps", content=b'{"samples": ', headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert "body" in _problems(resp)


def test_too_many_configs_is_422(sqlite_url):
    from store.migrate import upgrade

    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, max_sweep_configs=10)
    with make_client(settings) as c:
        resp = c.post("/sweeps", json={"samples": 11, "backend": "cpu"})
    assert resp.status_code == 422 and "exceed the limit of 10" in _problems(resp)["samples"]
    assert _count(sqlite_url) == 0


def test_body_over_the_limit_is_413_and_writes_nothing(sqlite_url):
    from store.migrate import upgrade

    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, max_body_bytes=2048)
    configs = [{**BASE, "data_seed": i} for i in range(40)]  # ~12 KB of JSON
    with make_client(settings) as c:
        resp = c.post("/sweeps", json={"configs": configs, "backend": "cpu"})
        assert resp.status_code == 413
        assert "exceeds the limit of 2048 bytes" in _problems(resp)["body"]
        # Without a Content-Length (a chunked upload) the bytes themselves are counted.
        chunks = iter([json.dumps({"configs": configs, "backend": "cpu"}).encode()[i:i + 500] for i in range(0, 12000, 500)])
        resp = c.post("/sweeps", content=chunks, headers={"content-type": "application/json"})
        assert resp.status_code == 413
        small = c.post("/sweeps", json={"configs": configs[:2], "backend": "cpu"})
        assert small.status_code == 202
    assert _count(sqlite_url) == 1
    assert _count(sqlite_url, ConfigRun) == 2


def test_budget_from_the_queue_workers_memory_or_request_or_fallback(client, settings):
    from datetime import timedelta

    from store.models import Worker

    def register(name: str, queue: str, memory: int | None, age_s: float = 0.0) -> None:
        with session_scope(settings.database_url) as s:
            repo.register_worker(s, name, queue=queue, backend="cuda", gpu=0, concurrency=1, device=f"dev-{name}",
                                 total_memory=memory, driver_version=None, compiler_version=None, arch=None,
                                 versions={}, hostname="h", pid=1)
            s.flush()
            s.get(Worker, name).last_heartbeat = repo.now() - timedelta(seconds=age_s)

    gpu_queue = settings.queue_name("gpu")
    register("big", gpu_queue, 141 * GIB)
    register("small", gpu_queue, 24 * GIB)
    register("stale", gpu_queue, 4 * GIB, age_s=10 * settings.worker_stale_s)
    register("other-queue", "elsewhere-gpu", 2 * GIB)
    resp = client.post("/sweeps", json={"samples": 2, "backend": "cuda", "ranges": SMALL}).json()
    assert (resp["budget_source"], resp["splitkv_budget"]) == ("device", 3 * GIB)  # 24 GiB // 8, the smallest live one
    assert client.get(f"/sweeps/{resp['id']}").json()["device"] == "dev-small"
    explicit = client.post("/sweeps", json={"samples": 2, "backend": "cuda", "ranges": SMALL,
                                            "splitkv_extra_bytes_limit": 12345}).json()
    assert (explicit["budget_source"], explicit["splitkv_budget"]) == ("request", 12345)
    cpu = client.post("/sweeps", json={"samples": 2, "backend": "cpu", "ranges": SMALL}).json()
    assert (cpu["budget_source"], cpu["splitkv_budget"]) == ("fallback", 3 * GIB // 2)


def test_cancel_skips_queued_configs_and_only_once(client, settings):
    sid = client.post("/sweeps", json={"samples": 5, "seed": 3, "backend": "cpu", "ranges": SMALL}).json()["id"]
    resp = client.post(f"/sweeps/{sid}/cancel", json={})
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    states = {r["state"] for r in client.get(f"/sweeps/{sid}/results").json()["data"]}
    assert states == {"cancelled"}
    again = client.post(f"/sweeps/{sid}/cancel", json={})
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    assert client.post("/sweeps/424242/cancel", json={}).status_code == 404


def test_rerun_of_failures_only_needs_failures(client, settings):
    sid = client.post("/sweeps", json={"configs": [BASE, {**BASE, "data_seed": 1}], "backend": "cpu", "label": "r"}).json()["id"]
    none = client.post(f"/sweeps/{sid}/rerun", json={"failures_only": True})
    assert none.status_code == 409 and "no failures" in none.json()["detail"]
    with session_scope(settings.database_url) as s:
        h = repo.queued_configs(s, sid)[1][0]
        repo.record_result(s, sid, h, {"outcome": "fail", "failed_gate": "rms"})
    published(settings)  # drain the first sweep's tasks
    resp = client.post(f"/sweeps/{sid}/rerun", json={"failures_only": True, "label": "again"})
    assert resp.status_code == 202, resp.text
    new = client.get(f"/sweeps/{resp.json()['id']}").json()
    assert (new["rerun_of"], new["label"], new["configs_total"], new["backend"]) == (sid, "again", 1, "cpu")
    assert [h for t in published(settings) for h, _ in t["args"][1]] == [h]
    everything = client.post(f"/sweeps/{sid}/rerun", json={}).json()
    assert everything["configs_total"] == 2


def test_openapi_documents_every_endpoint_and_schema_family(client):
    spec = client.get("/openapi.json").json()
    paths = {(p, m) for p, ops in spec["paths"].items() for m in ops}
    for expected in [("/sweeps", "post"), ("/sweeps", "get"), ("/sweeps/{sweep_id}", "get"),
                     ("/sweeps/{sweep_id}/results", "get"), ("/sweeps/{sweep_id}/cancel", "post"),
                     ("/sweeps/{sweep_id}/rerun", "post"), ("/failures", "get"), ("/failures/summary", "get"),
                     ("/workers", "get"), ("/healthz", "get"), ("/metrics", "get")]:
        assert expected in paths
    schemas = spec["components"]["schemas"]
    for name in ("SweepCreate", "SweepPublic", "SweepsPublic", "SweepAccepted", "ConfigRunPublic", "ConfigRunsPublic",
                 "WorkerPublic", "WorkersPublic", "FailureSummary", "Problems"):
        assert name in schemas
    assert spec["paths"]["/sweeps"]["post"]["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/Problems")
    assert "bearer" in json.dumps(spec["components"].get("securitySchemes", {})).lower()


def test_sanitize_picks_a_share_of_every_kernel_variant_and_is_refused_where_no_sanitizer_runs(client, settings):
    from kernels.select import variant_key

    resp = client.post("/sweeps", json={"samples": 40, "seed": 3, "backend": "cuda", "ranges": SMALL,
                                        "sanitize": "racecheck", "sanitize_share": 0.25})
    assert resp.status_code == 202, resp.text
    with session_scope(settings.database_url) as s:
        sweep = s.get(Sweep, resp.json()["id"])
        request = dict(sweep.request)
        configs = {h: c for h, c in repo.queued_configs(s, sweep.id)}
        assert repo.sweep_sanitize(s, sweep.id) == ("racecheck", frozenset(request["sanitize_configs"]))
    from attnconfig import parse_config

    by_variant: dict[str, list[str]] = {}
    for h, c in configs.items():
        by_variant.setdefault(variant_key(parse_config(c)), []).append(h)
    picked = set(request["sanitize_configs"])
    assert picked <= set(configs) and len(picked) < len(configs)
    for hashes in by_variant.values():   # every variant, a quarter of it rounded up
        assert len(picked & set(hashes)) == -(-len(hashes) // 4)
    for backend, rule in (("cpu", "the cpu backend emulates the kernels"), ("hip", "unsupported on hip")):
        bad = client.post("/sweeps", json={"samples": 2, "backend": backend, "sanitize": "memcheck"})
        assert bad.status_code == 422 and rule in _problems(bad)["sanitize"], bad.text
        assert "--" not in _problems(bad)["sanitize"], bad.text   # a REST caller has no CLI options
    bad = client.post("/sweeps", json={"samples": 2, "backend": "cuda", "sanitize": "memcheck", "sanitize_share": 1.5})
    assert bad.status_code == 422 and "sanitize_share" in _problems(bad)
