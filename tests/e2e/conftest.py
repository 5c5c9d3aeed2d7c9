"""A live API (uvicorn on a free port, over a fresh PostgreSQL database) and headless Chromium.

The browser is Debian's chromium driven by Playwright's Python package; Playwright's own browser
download cannot run here. Screenshots go to tests/e2e/artifacts/.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from harness import free_port, wait_for

CHROMIUM = os.environ.get("ATTNSWEEP_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    absent = not (os.access(CHROMIUM, os.X_OK) or shutil.which(CHROMIUM))
    for item in items:
        if here in Path(item.fspath).parents and absent:
            item.add_marker(pytest.mark.skip(reason=f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)"))


@dataclass
class Live:
    url: str  # the API's base URL
    database_url: str


@pytest.fixture
def live(pg_url: str) -> Iterator[Live]:
    import uvicorn

    from api.main import create_app
    from store.migrate import upgrade
    from tests.unit.api.conftest import make_settings

    upgrade(pg_url)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(make_settings(pg_url)), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("the API's server thread ended before it started")
        return server.started

    wait_for(started, 20, "the API to start", interval=0.05)
    try:
        yield Live(url=f"http://127.0.0.1:{port}", database_url=pg_url)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Console:
    """Errors the page logged or threw; `expect_http(422)` allows the failed fetches a test provokes."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.allowed: list[int] = []

    def expect_http(self, code: int) -> None:
        self.allowed.append(code)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(f"status of {c}" in e for c in self.allowed)]


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, permissions=["clipboard-read", "clipboard-write"])
    pg = context.new_page()
    pg.set_default_timeout(30_000)  # generous: CI shares two cores with PostgreSQL and the workers
    yield pg
    context.close()


@pytest.fixture
def console(page: Any) -> Console:
    seen = Console()
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.errors.append(f"uncaught: {e}"))
    return seen


def wait_until(page: Any, expression: str, timeout_ms: float = 30_000) -> Any:
    """Poll a JavaScript expression until it is truthy; its value. Playwright's wait_for_function
    evaluates its string inside the page with eval, which the pages' Content-Security-Policy
    (no 'unsafe-eval') refuses; page.evaluate runs through the DevTools protocol instead."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        value = page.evaluate(expression)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_ms / 1000:g} s waiting for {expression}")
        time.sleep(0.1)


def screenshot(target: Any, name: str, **kwargs: Any) -> Path:
    """A page or an element of it, as tests/e2e/artifacts/NAME.png."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    target.screenshot(path=str(path), **kwargs)
    return path
