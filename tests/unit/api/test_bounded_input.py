"""Every integer, string and cost a request carries is bounded: 422 naming the field and the rule.

Integers are bounded by the store's columns (int4, int8), labels by their column's length; NUL
characters and lone surrogates (which PostgreSQL and UTF-8 cannot hold) are refused; a request's
sampling cost is capped (max_draws). The same rules reach the CLI as one line, exit 2.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.api.conftest import BASE, make_client, make_settings

INT4 = 2**31 - 1
INT8 = 2**63 - 1


def _problems(resp) -> dict[str, str]:  # noqa: ANN001
    return {p["field"]: p["rule"] for p in resp.json()["detail"]}


def _count(client) -> int:  # noqa: ANN001
    return client.get("/sweeps").json()["count"]


@pytest.mark.parametrize(
    "payload, field, words",
    [
        ({"samples": 2, "seed": INT8 + 1}, "seed", f"less than or equal to {INT8}"),
        ({"samples": 2, "splitkv_extra_bytes_limit": 2**64}, "splitkv_extra_bytes_limit", f"{INT8}"),
        ({"samples": 2, "reference_bytes_limit": 2**70}, "reference_bytes_limit", f"{INT8}"),
        ({"samples": 2, "max_tokens": 10**40}, "max_tokens", f"{INT8}"),
        ({"samples": 2, "ranges": {"seq_len_k": [1, 10**40]}}, "ranges.seq_len_k", f"must be <= {INT4}"),
        ({"samples": 2, "ranges": {"g": [2**31, 2**31]}}, "ranges.g", f"must be <= {INT4}"),
        ({"samples": 2, "max_draws": 10**7}, "max_draws", "less than or equal to 1000000"),
        ({"samples": 2, "label": "x" * 201}, "label", "at most 200 characters"),
        ({"samples": 2, "label": "a\x00b"}, "label", "NUL"),
        ({"configs": [{**BASE, "seq_len_k": 2**31}]}, "configs.0.seq_len_k", f"{INT4}"),
        ({"configs": [{**BASE, "data_seed": 2**63}]}, "configs.0.data_seed", f"{INT8}"),
        ({"configs": [{**BASE, "g": 2, "causal": True, "prefix_offset": [0, 2**40]}]}, "configs.0.prefix_offset.1", f"{INT4}"),
    ],
)
def test_out_of_bounds_body_is_422_naming_the_field(client, payload, field, words):
    resp = client.post("/sweeps", json=payload)
    assert resp.status_code == 422, resp.text
    problems = _problems(resp)
    assert field in problems, problems
    assert words in problems[field], problems[field]
    assert _count(client) == 0


def test_lone_surrogate_in_a_label_is_422(client):
    # The escape stays an escape on the wire; the JSON parser makes it a lone surrogate.
    body = b'{"samples": 2, "backend": "cpu", "label": "bad \\ud800 label"}'
    resp = client.post("/sweeps", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 422, resp.text
    assert any(w in _problems(resp)["label"] for w in ("surrogate", "unicode"))
    assert _count(client) == 0


def test_rerun_label_is_bounded_too(client):
    sweep = client.post("/sweeps", json={"configs": [BASE], "backend": "cpu"}).json()["id"]
    resp = client.post(f"/sweeps/{sweep}/rerun", json={"label": "y" * 300})
    assert resp.status_code == 422 and "label" in _problems(resp)


@pytest.mark.parametrize(
    "path, field",
    [
        ("/sweeps/2147483648", "sweep_id"),
        ("/sweeps/0", "sweep_id"),
        ("/sweeps/99999999999999999999999/results", "sweep_id"),
        ("/sweeps/1/results?offset=9223372036854775808", "offset"),
        ("/sweeps?offset=9223372036854775808", "offset"),
        ("/failures?offset=9223372036854775808", "offset"),
        ("/ci/commits?offset=9223372036854775808", "offset"),
        ("/failures?seq_len_k=2147483648", "seq_len_k"),
        ("/failures?g=1:99999999999999999999999999", "g"),
        ("/failures?sweep=1,2,2147483648", "sweep"),
        ("/failures?data_seed=9223372036854775808", "data_seed"),
        ("/failures/summary?by=dtype&head_dim_qk=-2147483649:", "head_dim_qk"),
        ("/sweeps?label=a%00b", "label"),
        ("/failures?device=x%00", "device"),
        ("/sweeps?label=" + "z" * 1001, "label"),
    ],
)
def test_out_of_bounds_query_and_path_is_422_naming_the_parameter(client, path, field):
    resp = client.get(path)
    assert resp.status_code == 422, resp.text
    assert field in _problems(resp), resp.text


def test_the_largest_storable_values_are_accepted(client):
    """The bounds are the columns' own: the edge values pass validation and the store."""
    assert client.get(f"/sweeps/{INT4}").status_code == 404
    assert client.get(f"/failures?data_seed={INT8}&seq_len_k={INT4}&offset={INT8}").status_code == 200
    resp = client.post("/sweeps", json={"configs": [{**BASE, "data_seed": INT8}], "backend": "cpu", "seed": INT8,
                                        "label": "L" * 200})
    assert resp.status_code == 202, resp.text
    run = client.get(f"/sweeps/{resp.json()['id']}/results").json()["data"][0]
    assert run["config"]["data_seed"] == INT8


def test_default_draws_are_capped_and_a_larger_cap_is_refused(sqlite_url):
    from store.migrate import upgrade

    upgrade(sqlite_url)
    with make_client(make_settings(sqlite_url, max_draws=500)) as c:
        over = c.post("/sweeps", json={"samples": 2, "backend": "cpu", "max_draws": 501})
        assert over.status_code == 422 and "ATTNSWEEP_MAX_DRAWS" in _problems(over)["max_draws"]
        # Default 1000 * samples = 5000 draws, cut to 500: an unsatisfiable request stops there.
        stuck = c.post("/sweeps", json={"samples": 5, "backend": "cpu", "reference_bytes_limit": 1})
        assert stuck.status_code == 422, stuck.text
        assert "cap of 500 draws" in _problems(stuck)["max_draws"]
        assert c.get("/sweeps").json()["count"] == 0


@pytest.mark.parametrize(
    "args, field",
    [
        (["--range", "seq_len_k=1:1e40"], "--range seq_len_k"),
        (["--range", "g=1:" + "9" * 5000], "--range g"),
        (["--seed", str(2**63)], "seed"),
        (["--samples", str(10**7)], "samples"),
        (["--reference-flops-limit", "inf"], "--reference-flops-limit"),
    ],
)
def test_cli_says_the_same_in_one_line_exit_2(args, field):
    # The rule the API gives, named by the option the user typed.
    proc = subprocess.run([sys.executable, "-m", "cli", "sample", "--backend", "cpu", *args],
                          capture_output=True, text=True, timeout=120, env={"COLUMNS": "60", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and f"{field}:" in lines[0], lines[0]
    json.dumps(lines)  # printable
