"""The dashboard at 1440 and 800 px: no sideways page scroll, a legend with every heatmap colour,
nothing over the heatmap, default axes chosen from the failures, ISO dates, failure rates on the
index, no zero-count chips, repositories on the CI page. Screenshots: tests/e2e/artifacts/layout-*."""
from __future__ import annotations

import re

import pytest

from tests.e2e import seed
from tests.e2e.conftest import screenshot

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
WIDTHS = [1440, 800]


def _no_page_scroll(page) -> None:  # noqa: ANN001
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"


@pytest.mark.parametrize("width", WIDTHS)
def test_sweeps_index(live, page, console, width):
    nightly = seed.seed_finished(live.database_url, label="nightly")
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live.url}/dashboard")
    row = page.locator(f'#sweeps tr[data-sweep="{nightly.sweep_id}"]')
    row.wait_for()
    _no_page_scroll(page)
    cells = row.locator("td").all_inner_texts()
    headers = page.locator("#sweeps th").all_inner_texts()
    by = dict(zip(headers, cells))
    # fail 4 + nan 1 + error 1 of 72 finished, 2 not applicable.
    assert by["failure rate"] == "8.6%"
    assert ISO.match(by["started (UTC)"]), by["started (UTC)"]
    chips = row.locator(".count").all_inner_texts()
    assert chips and not [c for c in chips if c.endswith(" 0")], chips
    assert "duplicate 2" in chips and "pass 64" in chips
    screenshot(page, f"layout-sweeps-{width}", full_page=True)
    assert console.unexpected() == []


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep_page(live, page, console, width):
    nightly = seed.seed_finished(live.database_url, label="nightly")
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live.url}/dashboard/sweeps/{nightly.sweep_id}")
    page.wait_for_selector("#failures tbody tr[data-seq]")
    page.wait_for_selector("#heatmap[data-cells]")
    _no_page_scroll(page)
    # The failure table scrolls in its own box when it is wider than the screen.
    box = page.evaluate("""() => { const w = document.querySelector('#failures').parentElement;
        return [getComputedStyle(w).overflowX, w.scrollWidth, w.clientWidth]; }""")
    assert box[0] == "auto"
    if width == 800:
        assert box[1] > box[2], "at 800 px the failure table is wider than its box and scrolls in it"

    # Default axes: the seeded failures are exactly bf16 at split_kv >= 16.
    heat = page.evaluate("() => { const t = document.getElementById('heatmap').data[0]; return {x: t.x, y: t.y, colorscale: t.colorscale, showscale: t.showscale}; }")
    assert heat["y"] == ["bf16", "f16", "f32", "i8"] and heat["x"] == ["1", "2", "4", "8", "16", "32"]
    assert "hx=split_kv" in page.url and "hy=dtype" in page.url
    # Every colour of the scale is in the legend, the zero-failure green first.
    legend = page.locator("#heatmap-legend")
    assert legend.is_visible()
    # The swatches' colours come from dashboard.css (the CSP allows no inline style attribute).
    painted = page.evaluate("""() => [...document.querySelectorAll('#heatmap-legend i')].map(i => {
        const s = getComputedStyle(i); return s.backgroundColor + ' ' + s.backgroundImage; }).join(' ')""")

    def rgb(colour: str) -> str:
        return f"rgb({int(colour[1:3], 16)}, {int(colour[3:5], 16)}, {int(colour[5:7], 16)})"

    for _, colour in heat["colorscale"]:
        assert rgb(colour) in painted, colour
    assert painted.index(rgb("#c8e6c9")) < painted.index(rgb("#ffe0b2"))
    assert "0 failures" in legend.inner_text()
    assert heat["showscale"] is False
    # Nothing covers the heatmap: no mode bar anywhere on the page.
    assert page.locator(".modebar").count() == 0
    hm = page.locator("#heatmap").bounding_box()
    plot = page.evaluate("() => { const r = document.querySelector('#heatmap .nsewdrag').getBoundingClientRect(); return [r.left, r.right]; }")
    assert hm["x"] <= plot[0] and plot[1] <= hm["x"] + hm["width"] + 1
    screenshot(page, f"layout-sweep-{width}", full_page=True)
    assert console.unexpected() == []


@pytest.mark.parametrize("width", WIDTHS)
def test_ci_page_lists_repositories(live, page, console, width):
    seed.seed_ci(live.database_url, "acme/attn-kernels", ["a" * 40, "b" * 40], broken_from=1)
    seed.seed_ci(live.database_url, "acme/other", ["c" * 40], broken_from=5)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live.url}/dashboard/ci")
    page.wait_for_selector("#repositories tr[data-repository]")
    rows = page.locator("#repositories tbody tr")
    assert [r.get_attribute("data-repository") for r in rows.all()] == ["acme/attn-kernels", "acme/other"]
    first = rows.first.locator("td").all_inner_texts()
    assert first[1] == "2" and first[2] == "b" * 10 and first[4] == "fail" and ISO.match(first[5])
    assert rows.nth(1).locator("td").nth(4).inner_text() == "pass"
    rows.nth(1).locator("a").click()
    page.wait_for_selector('#rate-chart[data-points="1"]')
    assert "repository=acme%2Fother" in page.url or "repository=acme/other" in page.url
    assert page.locator("#commits tbody tr").first.get_attribute("data-commit") == "c" * 40
    _no_page_scroll(page)
    screenshot(page, f"layout-ci-{width}", full_page=True)
    assert console.unexpected() == []
