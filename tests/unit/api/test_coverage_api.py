"""GET /sweeps/{id}/coverage, the data_regime filter and grouping, and the regime and coverage
fields of POST /sweeps."""
from __future__ import annotations

import pytest

from tests.e2e import seed
from tests.unit.api.conftest import make_client, make_settings


@pytest.fixture
def seeded(sqlite_url):  # noqa: ANN001, ANN201
    from store.migrate import upgrade

    upgrade(sqlite_url)
    with make_client(make_settings(sqlite_url)) as client:
        yield client, seed.seed_regimes(sqlite_url), seed.seed_finished(sqlite_url)


def _problems(resp) -> dict[str, str]:  # noqa: ANN001
    return {p["field"]: p["rule"] for p in resp.json()["detail"]}


def test_coverage_report_of_a_stored_sweep(seeded):
    from store.coverage import sweep_coverage
    from store.db import session_scope

    client, regimes, _plain = seeded
    resp = client.get(f"/sweeps/{regimes.sweep_id}/coverage")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["sweep_id"] == regimes.sweep_id
    assert body["regimes"] == ["normal", "sink"] and body["paths"] == ["grouped", "rowwise"]
    assert body["features"]["dtype"] == ["f16", "bf16", "f32", "i8"]
    with session_scope(client.app.state.settings.database_url) as s:
        assert {k: v for k, v in body.items() if k not in ("sweep_id", "features")} == sweep_coverage(s, regimes.sweep_id)
    cells = {(c["path"], c["regime"], c["feature"], c["value"]): c for c in body["cells"]}
    # 18 bf16 configs, every third of the grid sink; the planted failures are bf16 with split_kv >= 16.
    assert cells[("grouped", "sink", "dtype", "bf16")]["configs"] == 6
    assert cells[("grouped", "normal", "dtype", "bf16")]["failing"] + cells[("grouped", "sink", "dtype", "bf16")]["failing"] == 6
    assert cells[("grouped", "normal", "peak", "peaked")]["state"] == "covered"  # seed.REGIME_FACTS
    assert cells[("grouped", "normal", "peak", "flat")]["state"] == "never"
    t = body["totals"]
    assert t["covered"] + t["rare"] + t["never"] == body["cells_total"] == len(body["cells"])
    rare = client.get(f"/sweeps/{regimes.sweep_id}/coverage?rare=100").json()
    assert rare["totals"]["covered"] == 0 and rare["rare_below"] == 100


def test_coverage_of_a_missing_sweep_is_404_and_a_bad_rare_422(seeded):
    client, regimes, _plain = seeded
    assert client.get("/sweeps/999999/coverage").status_code == 404
    resp = client.get(f"/sweeps/{regimes.sweep_id}/coverage?rare=0")
    assert resp.status_code == 422 and "rare" in _problems(resp)


def test_failures_filter_and_group_by_data_regime(seeded):
    client, regimes, plain = seeded
    sink = client.get(f"/failures?data_regime=sink&sweep={regimes.sweep_id}&limit=100").json()["data"]
    expected = [r for r in regimes.failures() if r.config.data_regime == "sink"]
    assert len(sink) == len(expected) > 0 and {r["data_regime"] for r in sink} == {"sink"}
    assert all(r["config"]["data_regime"] == "sink" for r in sink)
    summary = client.get(f"/failures/summary?by=data_regime&sweep={regimes.sweep_id}").json()
    groups = {g["key"]["data_regime"]: g for g in summary["groups"]}
    assert set(groups) == {"normal", "sink"} and groups["sink"]["runs"] == 24 and groups["normal"]["runs"] == 48
    assert groups["sink"]["failures"] == len(expected)
    rates = client.get(f"/sweeps/{plain.sweep_id}/failure-rates?by=data_regime&by=dtype").json()
    assert rates["axes"]["data_regime"] == ["normal"]
    bad = client.get("/failures?data_regime=spiky")
    assert bad.status_code == 422 and "must be one of normal" in _problems(bad)["data_regime"]


def test_sweep_results_carry_regime_and_facts(seeded):
    client, regimes, _plain = seeded
    rows = client.get(f"/sweeps/{regimes.sweep_id}/results?limit=3").json()["data"]
    assert [r["data_regime"] for r in rows] == ["sink", "normal", "normal"]
    assert rows[1]["facts"] == seed.REGIME_FACTS


@pytest.mark.parametrize("payload, field, words", [
    ({"samples": 2, "data_regimes": {"spiky": 1}}, "data_regimes.spiky", "unknown regime 'spiky'"),
    ({"samples": 2, "data_regimes": {"sink": -1}}, "data_regimes.sink", "a share must be a finite number > 0"),
    ({"samples": 2, "data_regimes": "sink"}, "data_regimes", "a list of regime names or an object"),
    ({"samples": 2, "coverage_prior_sweeps": 3}, "coverage_prior_sweeps", "needs coverage_guided"),
    ({"samples": 2, "coverage_guided": True, "coverage_prior_sweeps": 101}, "coverage_prior_sweeps", "less than or equal to 100"),
])
def test_bad_regimes_and_prior_are_422_naming_the_field(client, payload, field, words):
    resp = client.post("/sweeps", json=payload)
    assert resp.status_code == 422, resp.text
    problems = _problems(resp)
    assert field in problems and words in problems[field], problems


def test_guided_sweep_with_a_prior_is_accepted_and_stores_its_request(seeded):
    client, _regimes, _plain = seeded
    body = {"samples": 4, "seed": 2, "backend": "cpu", "data_regimes": ["normal", "uniform"], "coverage_guided": True,
            "coverage_prior_sweeps": 2, "ranges": {"seq_len_k": [1, 256], "seq_len_q": [1, 16]}}
    resp = client.post("/sweeps", json=body)
    assert resp.status_code == 202, resp.text
    sweep_id = resp.json()["id"]
    request = client.get(f"/sweeps/{sweep_id}").json()["request"]
    assert request["coverage_guided"] is True and request["coverage_prior_sweeps"] == 2
    assert request["data_regimes"] == {"normal": 0.5, "uniform": 0.5}
    rows = client.get(f"/sweeps/{sweep_id}/results").json()["data"]
    assert {r["data_regime"] for r in rows} <= {"normal", "uniform"} and len(rows) == 4
