"""/docs and /redoc render in Chromium with every request off the loopback interface refused."""
from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import screenshot

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@pytest.fixture
def offline(page):  # noqa: ANN001, ANN201
    blocked: list[str] = []

    def route(r) -> None:  # noqa: ANN001
        if r.request.url.startswith(("data:", "blob:")) or urlparse(r.request.url).hostname in LOOPBACK:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort("internetdisconnected")

    page.route("**/*", route)
    return blocked


def test_swagger_ui_renders_operations_offline(live, page, offline, console):
    page.goto(f"{live.url}/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/sweeps" in [p.strip().replace("\u200b", "") for p in paths], paths
    assert page.locator(".opblock").count() >= 10
    # An operation opens with its described parameters (api/schemas/descriptions.py).
    page.locator(".opblock-get .opblock-summary-path", has_text="/failures").first.click()
    page.wait_for_selector(".parameters-container .parameter__name")
    assert "most rows to return" in page.locator(".opblock.is-open").first.inner_text()
    screenshot(page, "docs-offline")
    assert offline == [], offline
    assert not console.unexpected(), console.errors


def test_redoc_renders_offline(live, page, offline, console):
    page.goto(f"{live.url}/redoc")
    page.wait_for_selector("[data-section-id^='tag/']", timeout=30_000)
    assert "Queue sampled split-KV attention configs" in page.inner_text("body")
    # Nothing comes from outside: not even ReDoc's logo (api/docs.py serves the bundle without it),
    # and nothing breaks the Content-Security-Policy.
    assert offline == [], offline
    assert not console.unexpected(), console.errors
