"""The kernel under test through the API: POST /sweeps takes the kernels installed with the
service and refuses paths; GET /kernels lists them; GET /compare and the dashboard's comparison
page show sweeps of several kernels side by side."""
from __future__ import annotations

from sweeps.spec import SweepSpec
from tests.unit.triage.sweeps import run_at

SMALL = dict(samples=6, seed=3, dtypes=["f16"], ranges={"seq_len_k": [1, 128], "g": [1, 2], "seq_len_q": [1, 8],
                                                       "head_dim_qk": [32, 32], "head_dim_v": [32, 32],
                                                       "with_attn_bias": [0, 0], "causal": [0, 0],
                                                       "trans_q": [0, 0], "trans_k": [0, 0], "trans_v": [0, 0]})


def test_a_sweep_names_its_kernel_and_paths_are_refused(client, tmp_path):
    accepted = client.post("/sweeps", json={"samples": 3, "backend": "cpu", "kernel": "torch-sdpa:math"})
    assert accepted.status_code == 202, accepted.text
    sweep = client.get(f"/sweeps/{accepted.json()['id']}").json()
    assert (sweep["kernel"], sweep["request"]["kernel"]) == ("torch-sdpa:math", "torch-sdpa:math")
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    for kernel, rule in ((f"so:{lib}", "the service sweeps the kernels installed with it"),
                         ("os:system", "the service sweeps the kernels installed with it"),
                         ("no-such-kernel", "'no-such-kernel' is no kernel here")):
        refused = client.post("/sweeps", json={"samples": 3, "backend": "cpu", "kernel": kernel})
        assert refused.status_code == 422, refused.text
        assert any(p["field"] == "kernel" and rule in p["rule"] for p in refused.json()["detail"]), refused.text
    refused = client.post("/sweeps", json={"samples": 3, "kernel": "torch-sdpa:math", "defects": ["causal_off_by_one"]})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "defects"
    names = {k["name"]: k for k in client.get("/kernels").json()}
    assert names["torch-sdpa:flash"]["trusted"] and "attnsweep" in names


def test_sweeps_of_two_kernels_side_by_side(client, settings):
    ids = [run_at(settings.database_url, SweepSpec(**SMALL, kernel=k), backend="cpu", device_total_memory=None,
                  device=None) for k in ("torch-sdpa:math", "torch-sdpa:flash")]
    body = client.get("/compare", params={"sweeps": ",".join(map(str, ids))})
    assert body.status_code == 200, body.text
    got = body.json()
    assert [s["kernel_name"] for s in got["sweeps"]] == ["torch-sdpa:math", "torch-sdpa:flash"]
    assert got["common"] == 6 and all(s["configs"] == 6 for s in got["sweeps"])
    assert all(s["kernel_version"].startswith("torch ") for s in got["sweeps"])
    timed = [s for s in got["sweeps"] if s["timed"]]
    assert timed and min(s["time_ratio_median"] for s in timed) >= 1.0
    assert sum(s["fastest"] for s in got["sweeps"]) == timed[0]["timed"]
    assert client.get("/compare", params={"sweeps": f"{ids[0]}"}).status_code == 422
    assert client.get("/compare", params={"sweeps": f"{ids[0]},999"}).status_code == 404
    page = client.get("/dashboard/compare", params={"sweeps": ",".join(map(str, ids))})
    assert page.status_code == 200 and "compare.js" in page.text
