"""The sweep page's coverage view in headless Chromium against a live API over PostgreSQL.

The seeded sweep (tests/e2e/seed.py seed_regimes) is the planted grid over two regimes, every
third config `sink`, each run with the same numeric facts.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from tests.e2e import seed
from tests.e2e.conftest import screenshot, wait_until


@pytest.fixture
def regimes(live):  # noqa: ANN001, ANN201
    return seed.seed_regimes(live.database_url)


def _report(live, sweep_id: int) -> dict:  # noqa: ANN001
    with urllib.request.urlopen(f"{live.url}/sweeps/{sweep_id}/coverage") as resp:
        return json.load(resp)


def _drawn(page) -> dict:  # noqa: ANN001
    return page.evaluate("""() => {
        const t = document.getElementById('coverage').data[0];
        return {x: t.x, y: t.y, z: t.z, text: t.text, path: document.getElementById('coverage').dataset.path};
    }""")


def _expected(report: dict, path: str, ys: list[str], xs: list[str]) -> tuple[list, list]:
    state = {"never": 0, "rare": 1, "covered": 2}
    cells = {(f"{c['feature']}={c['value']}", c["regime"]): c for c in report["cells"] if c["path"] == path}
    z = [[state[cells[(y, x)]["state"]] if (y, x) in cells else None for x in xs] for y in ys]
    text = [[str(cells[(y, x)]["configs"]) if (y, x) in cells else "" for x in xs] for y in ys]
    return z, text


def test_coverage_view_shows_covered_rare_and_never_cells_per_path(live, regimes, page, console):
    report = _report(live, regimes.sweep_id)
    page.goto(f"{live.url}/dashboard/sweeps/{regimes.sweep_id}")
    page.wait_for_selector("#coverage[data-cells]")
    drawn = _drawn(page)
    assert drawn["path"] == "grouped" and drawn["x"] == ["normal", "sink"]
    assert drawn["y"] == [f"{f}={v}" for f, values in report["features"].items() for v in values]
    assert (drawn["z"], drawn["text"]) == _expected(report, "grouped", drawn["y"], drawn["x"])
    row = drawn["y"].index("dtype=bf16")
    assert drawn["text"][row] == ["12", "6"] and drawn["z"][row] == [2, 2]
    peaked, flat = drawn["y"].index("peak=peaked"), drawn["y"].index("peak=flat")
    assert drawn["z"][peaked] == [2, 2] and drawn["z"][flat] == [0, 0]  # every run's facts: peaked rows
    assert drawn["z"][drawn["y"].index("dtype=i8")] == [None, None]  # the grouped path runs no i8

    t = report["totals"]
    assert page.inner_text("#coverage-totals") == \
        f"({t['covered']} covered, {t['rare']} rare, {t['never']} never of {report['cells_total']} cells)"
    legend = page.locator("#coverage-legend .key")
    assert legend.evaluate_all("keys => keys.map(k => k.dataset.state)") == ["covered", "rare", "never", "unreachable"]
    assert "3 configs or more" in legend.nth(0).inner_text() and "1 to 2 configs" in legend.nth(1).inner_text()
    assert page.locator("#coverage-section").evaluate(
        "s => s.compareDocumentPosition(document.getElementById('failures')) === Node.DOCUMENT_POSITION_PRECEDING")
    screenshot(page.locator("#coverage-section"), "coverage")

    assert page.locator("#coverage-path select[name=path] option").all_inner_texts() == report["paths"]
    page.select_option("#coverage-path select[name=path]", "rowwise")
    wait_until(page, "document.getElementById('coverage').dataset.path === 'rowwise'")
    drawn = _drawn(page)
    assert (drawn["z"], drawn["text"]) == _expected(report, "rowwise", drawn["y"], drawn["x"])
    i8 = drawn["y"].index("dtype=i8")
    assert drawn["text"][i8] == ["12", "6"]  # the grid's 18 i8 configs run on the rowwise path
    assert console.unexpected() == []


def test_coverage_view_follows_a_running_sweep(live, page, console):
    configs = seed.regimes_of(seed.grid())[:9]
    results = seed.results_for(configs)
    sweep_id = seed.create(live.database_url, configs, "running")
    seed.record(live.database_url, sweep_id, results[:3])
    page.goto(f"{live.url}/dashboard/sweeps/{sweep_id}")
    page.wait_for_selector("#coverage[data-cells]")
    count = "(t => t.text[t.y.indexOf('dtype=f16')])(document.getElementById('coverage').data[0])"
    assert page.evaluate(count) == ["2", "1"]
    seed.record(live.database_url, sweep_id, results[3:])
    wait_until(page, f"JSON.stringify({count}) === JSON.stringify(['6', '3'])")
    assert console.unexpected() == []
