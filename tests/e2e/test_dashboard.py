"""The dashboard in headless Chromium against a live API over PostgreSQL.

The seeded sweep (tests/e2e/seed.py) fails only where dtype=bf16 and split_kv >= 16.
"""
from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import ConfigRun
from tests.e2e import seed
from tests.e2e.conftest import screenshot, wait_until


@pytest.fixture
def nightly(live):  # noqa: ANN001, ANN201
    return seed.seed_finished(live.database_url, label="nightly")


def _planted_seqs(seeded: seed.Seeded, **where: Any) -> set[int]:
    return {i for i, c in enumerate(seeded.configs)
            if seed.planted(c) and all(getattr(c, k) == v for k, v in where.items())}


def _table_seqs(page) -> set[int]:  # noqa: ANN001
    return {int(s) for s in page.locator("#failures tbody tr[data-seq]").evaluate_all("rows => rows.map(r => r.dataset.seq)")}


def _wait_rows(page, n: int) -> None:  # noqa: ANN001
    wait_until(page, f"document.querySelectorAll('#failures tbody tr[data-seq]').length === {n}")


def _heatmap(page) -> dict:  # noqa: ANN001
    return page.evaluate("""() => {
        const t = document.getElementById('heatmap').data[0];
        return {x: t.x, y: t.y, z: t.z};
    }""")


def _open_sweep(page, live, sweep_id: int, query: str = "") -> None:  # noqa: ANN001
    page.goto(f"{live.url}/dashboard/sweeps/{sweep_id}{query}")
    page.wait_for_selector("#failures tbody tr")
    page.wait_for_selector("#heatmap[data-cells]")


def test_sweeps_page_shows_status_progress_outcomes_and_filter_reasons(live, nightly, page, console):
    page.goto(f"{live.url}/dashboard")
    row = page.locator(f'#sweeps tr[data-sweep="{nightly.sweep_id}"]')
    row.wait_for()
    text = row.inner_text()
    assert "nightly" in text and "done" in text and "72 / 72" in text
    for count in ("pass 64", "fail 4", "nan 1", "error 1", "not_applicable 2"):
        assert count in text, (count, text)
    for reason, n in seed.FILTERED.items():
        assert f"{reason} {n}" in text
    screenshot(page, "sweeps")
    assert console.unexpected() == []


def test_progress_refreshes_while_a_sweep_runs(live, page, console):
    configs = seed.grid()[:8]
    results = seed.results_for(configs)
    sweep_id = seed.create(live.database_url, configs, "running")
    seed.record(live.database_url, sweep_id, results[:3])

    page.goto(f"{live.url}/dashboard")
    row = page.locator(f'#sweeps tr[data-sweep="{sweep_id}"]')
    row.wait_for()
    assert "3 / 8" in row.inner_text() and row.get_attribute("data-status") == "running"
    seed.record(live.database_url, sweep_id, results[3:6])
    wait_until(page, f"document.querySelector('tr[data-sweep=\"{sweep_id}\"]').innerText.includes('6 / 8')")
    screenshot(page, "sweeps-running")

    page.goto(f"{live.url}/dashboard/sweeps/{sweep_id}")
    wait_until(page, "document.getElementById('progress-text').textContent === '6 / 8 configs done'")
    assert page.inner_text("#status") == "running"
    seed.record(live.database_url, sweep_id, results[6:])
    wait_until(page, "document.getElementById('status').textContent === 'done'")
    assert page.inner_text("#progress-text") == "8 / 8 configs done"
    assert console.unexpected() == []


def test_sweep_page_charts_counts_and_heatmap_shows_the_planted_pattern(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id)
    outcomes = page.evaluate("() => { const t = document.getElementById('outcomes-chart').data[0]; return [t.x, t.y]; }")
    assert dict(zip(*outcomes)) == {"pass": 64, "fail": 4, "nan": 1, "fault": 0, "unsafe": 0, "error": 1, "timeout": 0,
                                    "oom": 0, "not_applicable": 2}
    reasons = page.evaluate("() => document.getElementById('reasons-chart').data.map(t => [t.name, t.y, t.x])")
    filtered = next(r for r in reasons if r[0] == "filtered before running")
    assert dict(zip(filtered[1], filtered[2])) == seed.FILTERED

    heat = _heatmap(page)
    assert heat["y"] == ["bf16", "f16", "f32", "i8"] and heat["x"] == ["1", "2", "4", "8", "16", "32"]
    for dtype, rates in zip(heat["y"], heat["z"]):
        for split, rate in zip(heat["x"], rates):
            assert rate == (1 if dtype == "bf16" and int(split) >= 16 else 0), (dtype, split, rate)
    screenshot(page, "sweep", full_page=True)

    page.select_option("#heatmap-axes select[name=hy]", "seq_len_k_bucket")
    page.select_option("#heatmap-axes select[name=hx]", "dtype")
    wait_until(page, "(t => t.y[0] === '64-127' && t.x[0] === 'bf16')(document.getElementById('heatmap').data[0])")
    heat = _heatmap(page)
    assert heat["y"] == ["64-127", "256-511", "1024-2047"] and heat["x"] == ["bf16", "f16", "f32", "i8"]
    for rates in heat["z"]:  # per bucket: bf16 fails at split_kv 16 and 32 of its 6 splits
        assert rates == [pytest.approx(2 / 6), 0, 0, 0]
    assert "hy=seq_len_k_bucket" in page.url and "hx=dtype" in page.url
    screenshot(page.locator("#heatmap"), "heatmap-buckets")
    assert console.unexpected() == []


def test_a_filter_narrows_the_failure_table_to_the_right_rows(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id)
    _wait_rows(page, 6)
    assert _table_seqs(page) == _planted_seqs(nightly)
    assert page.inner_text("#failure-count") == "(6 matching)"

    page.select_option("#add-filter select[name=field]", "split_kv")
    page.fill("#add-filter input[name=value]", "32")
    page.click("#add-filter button[type=submit]")
    _wait_rows(page, 3)
    assert _table_seqs(page) == _planted_seqs(nightly, split_kv=32)

    page.select_option("#add-filter select[name=field]", "seq_len_k")
    page.fill("#add-filter input[name=value]", "256:511")
    page.click("#add-filter button[type=submit]")
    _wait_rows(page, 1)
    assert _table_seqs(page) == _planted_seqs(nightly, split_kv=32, seq_len_k=300)
    assert "split_kv=32" in page.url and "seq_len_k=256%3A511" in page.url
    row = page.locator("#failures tbody tr").first.inner_text()
    assert "nan" in row and "out_nonfinite" in row

    page.click('.chip[data-field="split_kv"] button')
    _wait_rows(page, 2)
    assert _table_seqs(page) == _planted_seqs(nightly, seq_len_k=300)
    screenshot(page, "failures-filtered", full_page=True)
    assert console.unexpected() == []


def test_the_table_shows_metric_against_bound_and_why_and_sorts(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id, "?gate=rms&outcome=fail")
    _wait_rows(page, 3)
    page.click('#failures th[data-sort="seq_len_k"]')
    page.click('#failures th[data-sort="seq_len_k"]')
    wait_until(page, "document.querySelector('#failures th[data-sort=\"seq_len_k\"]').dataset.dir === 'desc'")
    wait_until(page, "location.search.includes('sort=-seq_len_k')")
    _wait_rows(page, 3)
    rows = page.locator("#failures tbody tr").all_inner_texts()
    assert [re.search(r"k(\d+)", r).group(1) for r in rows] == ["1024", "300", "64"]
    for row, value in zip(rows, ("0.07", "0.06", "0.05")):
        assert f"out_rms {value} > 0.01" in row and "bf16 threshold" in row, row
    assert console.unexpected() == []


def test_a_bad_filter_shows_the_field_and_rule(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id)
    console.expect_http(422)
    page.select_option("#add-filter select[name=field]", "seq_len_k")
    page.fill("#add-filter input[name=value]", "abc")
    page.click("#add-filter button[type=submit]")
    page.wait_for_selector("#problems:not([hidden])")
    assert "seq_len_k: seq_len_k='abc': expected N, A,B,C or LO:HI" in page.inner_text("#problems")
    screenshot(page, "bad-filter", full_page=True)
    assert console.unexpected() == []


def test_clicking_a_heatmap_cell_filters_the_table_to_it(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id)
    page.locator("#heatmap").scroll_into_view_if_needed()   # below the Bugs panel: a click needs it on screen
    x, y = page.evaluate("""() => {
        const gd = document.getElementById('heatmap'), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const box = gd.querySelector('.nsewdrag').getBoundingClientRect(), t = gd.data[0];
        return [box.left + xa.c2p(t.x.indexOf('16')), box.top + ya.c2p(t.y.indexOf('bf16'))];
    }""")
    page.mouse.click(x, y)
    _wait_rows(page, 3)
    assert _table_seqs(page) == _planted_seqs(nightly, split_kv=16)
    chips = page.locator(".chip").all_inner_texts()
    assert {c.rstrip("×").strip() for c in chips} == {"dtype = bf16", "split_kv = 16"}
    assert console.unexpected() == []


def test_copy_puts_the_stored_reproducer_on_the_clipboard(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id)
    _wait_rows(page, 6)
    row = page.locator("#failures tbody tr").nth(3)
    seq = int(row.get_attribute("data-seq"))
    row.locator("button.copy").click()
    wait_until(page, "[...document.querySelectorAll('button.copy')].some(b => b.textContent === 'Copied')")
    copied = page.evaluate("navigator.clipboard.readText()")
    with session_scope(live.database_url) as s:
        stored = s.scalar(select(ConfigRun.reproducer).where(ConfigRun.sweep_id == nightly.sweep_id, ConfigRun.seq == seq))
    assert copied == stored and copied.startswith("attnsweep verify --backend cpu --config ")
    assert console.unexpected() == []


def test_links_lead_to_the_json_results_and_the_junit_xml(live, nightly, page, console):
    _open_sweep(page, live, nightly.sweep_id, "?dtype=bf16")
    failures = page.get_attribute("#json-failures", "href")
    assert failures == f"/sweeps/{nightly.sweep_id}/failures?dtype=bf16"
    body = page.request.get(live.url + failures).json()
    assert body["count"] == 6
    junit = page.request.get(live.url + page.get_attribute("#junit", "href"))
    assert junit.ok and b'failures="5"' in junit.body() and b'errors="1"' in junit.body()
    assert console.unexpected() == []


def test_ci_page_shows_verdicts_per_commit_and_the_regression_as_a_step(live, page, console):
    shas = [f"{i:x}" * 40 for i in range(1, 6)]
    ids = seed.seed_ci(live.database_url, "acme/attn-kernels", shas, broken_from=3)
    seed.seed_ci(live.database_url, "acme/other", ["f" * 40], broken_from=0)

    page.goto(f"{live.url}/dashboard/ci?repository=acme/attn-kernels")
    page.wait_for_selector('#rate-chart[data-points="5"]')
    rows = page.locator("#commits tbody tr")
    assert [r.get_attribute("data-commit") for r in rows.all()] == shas[::-1]  # newest first
    verdicts = [rows.nth(i).locator("td").nth(3).inner_text() for i in range(5)]
    assert verdicts == ["fail", "fail", "pass", "pass", "pass"]
    chart = page.evaluate("() => { const t = document.getElementById('rate-chart').data[0]; return [t.x, t.y]; }")
    assert chart[0] == [s[:8] for s in shas]  # oldest to newest, left to right
    assert chart[1] == [0, 0, 0, pytest.approx(6 / 70), pytest.approx(6 / 70)]
    screenshot(page, "ci", full_page=True)

    rows.first.locator("a").click()
    # The sweep page writes its heatmap axes into the query string (history.replaceState) as
    # soon as it loads, so the URL may already carry them when the wait starts.
    page.wait_for_url(re.compile(rf"/dashboard/sweeps/{ids[-1]}(\?.*)?$"), wait_until="commit")
    page.wait_for_selector("#failures tbody tr[data-seq]")
    assert console.unexpected() == []
