"""The dashboard leads with the bugs, in headless Chromium: the Bugs panel first on a sweep page
(above the charts and the heatmap), a badge when defects were compiled in, each failure's bug
in the failure table and a filter to one bug's failures; the home page counts each sweep's bugs."""
from __future__ import annotations

from store import clusters as stored
from store.db import session_scope
from store.models import Sweep
from tests.e2e import seed
from tests.e2e.conftest import screenshot, wait_until
from triage.sweep import triage_sweep


def _triaged_with_defects(url: str) -> seed.Seeded:
    nightly = seed.seed_finished(url, label="defects")
    with session_scope(url) as s:
        clusters = [c.to_dict() for c in triage_sweep(s, nightly.sweep_id, shrink_configs=False, classify_configs=False)]
        stored.store_clusters(s, nightly.sweep_id, clusters)
        sweep = s.get(Sweep, nightly.sweep_id)
        sweep.request = {**sweep.request, "defects": ["causal_off_by_one"]}
    return nightly


def test_the_sweep_page_leads_with_its_bugs(live, page, console):
    nightly = _triaged_with_defects(live.database_url)
    page.goto(f"{live.url}/dashboard/sweeps/{nightly.sweep_id}")
    wait_until(page, "document.getElementById('clusters-panel').dataset.status === 'done'")
    page.wait_for_selector("#failures tbody tr td.bug")
    bugs = page.locator("#clusters-panel").bounding_box()
    for later in ("#outcomes-chart", "#heatmap", "#failures"):
        assert bugs["y"] + bugs["height"] <= page.locator(later).bounding_box()["y"], later
    assert bugs["y"] < 400   # within the first screen at 1440x1000
    badge = page.locator("#defects")
    assert badge.is_visible() and badge.inner_text() == "defects compiled in: causal_off_by_one"
    screenshot(page, "sweep-bugs-1440", full_page=False)

    failing = len(nightly.failures())
    cells = page.locator("#failures tbody td.bug")
    assert cells.count() == min(failing, 50) and set(cells.all_inner_texts()) == {"1"}
    assert page.locator("#failures thead th").nth(1).inner_text() == "bug"
    page.locator("#clusters .cluster .bug-filter").first.click()
    wait_until(page, "location.search.includes('bug=1')")
    assert page.locator("#chips .chip[data-field=bug]").inner_text().startswith("bug = 1")
    wait_until(page, f"document.getElementById('failure-count').textContent === '({failing} matching)'")
    screenshot(page, "sweep-bug-filter-1440", full_page=False)
    page.set_viewport_size({"width": 800, "height": 1000})
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "sweep-bugs-800", full_page=False)
    copy = page.locator("#clusters .cluster button.copy").first.bounding_box()
    assert copy["x"] + copy["width"] <= 800   # the Copy button stays on screen at 800 px
    assert console.unexpected() == []


def test_the_home_page_counts_each_sweeps_bugs(live, page, console):
    triaged = _triaged_with_defects(live.database_url)
    untriaged = seed.seed_finished(live.database_url, label="untriaged")
    page.goto(f"{live.url}/dashboard")
    page.wait_for_selector(f"#sweeps tr[data-sweep='{triaged.sweep_id}'] td.bugs")
    assert page.locator(f"#sweeps tr[data-sweep='{triaged.sweep_id}'] td.bugs").inner_text() == "1 bug"
    assert page.locator(f"#sweeps tr[data-sweep='{untriaged.sweep_id}'] td.bugs").inner_text() == "–"
    screenshot(page, "sweeps-bugs-1440", full_page=False)
    assert console.unexpected() == []
