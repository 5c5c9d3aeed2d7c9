"""The dashboard's pages and static files as the API serves them (the browser tests are tests/e2e)."""
from __future__ import annotations

import gzip
import json
import re

import pytest


def test_pages_are_html_that_load_only_local_scripts(client):
    for path in ("/dashboard", "/dashboard/sweeps/1", "/dashboard/ci?repository=acme/kernels"):
        resp = client.get(path)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html"), path
        sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', resp.text)
        assert sources and all(s.startswith("/dashboard/static/") or s.startswith("data:") for s in sources), sources
        for src in (s for s in sources if s.startswith("/")):
            assert client.get(src).status_code == 200, src


def test_sweep_page_offers_every_filter_and_grouping_the_api_takes(client):
    from api.schemas.analysis import SweepFailuresQuery
    from store.analysis import RATE_FIELDS

    page = client.get("/dashboard/sweeps/3").text
    offered = set(re.findall(r'<option value="([a-z_0-9]+)" data-hint', page))
    assert offered == set(SweepFailuresQuery.model_fields) - {"sort", "limit", "offset", "label", "since", "until"}
    assert {"dtype", "split_kv", "causal", "gqa_ratio", "seq_len_k", "head_dim_qk", "kv_cache"} <= offered
    heatmap = set(re.findall(r"<option>([a-z_0-9]+)</option>", page.split('id="heatmap-axes"')[1].split("</form>")[0]))
    assert heatmap == set(RATE_FIELDS)
    data = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', page).group(1)
    assert json.loads(data)["sweep_id"] == 3
    assert "<script>" not in page   # the Content-Security-Policy runs no inline script
    assert client.get("/dashboard/sweeps/abc").status_code == 422


def test_plotly_is_served_from_the_package_gzipped_when_accepted(client):
    from importlib import resources

    shipped = (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    packed = client.get("/dashboard/static/plotly.min.js", headers={"accept-encoding": "gzip"})
    assert packed.status_code == 200 and packed.headers["content-type"].startswith("text/javascript")
    assert packed.content == shipped  # httpx decodes the gzip body
    raw = client.get("/dashboard/static/plotly.min.js", headers={"accept-encoding": "identity"})
    assert raw.headers.get("content-encoding") is None and raw.content == shipped
    assert len(gzip.compress(shipped)) < len(shipped) / 2


@pytest.mark.parametrize("name", ["nothing.js", "..%2F..%2Fmain.py", "routes.py", "%2Fetc%2Fpasswd"])
def test_static_serves_only_its_own_files(client, name):
    assert client.get(f"/dashboard/static/{name}").status_code == 404
