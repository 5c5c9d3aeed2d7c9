"""The workers page in headless Chromium: every registered worker with its state, and per queue
the live workers (0 shown as such, never left out) and the store's gauges, from GET /workers and
GET /metrics."""
from __future__ import annotations

from store import repo
from store.db import session_scope
from tests.e2e.conftest import screenshot, wait_until


def _worker(name: str, queue: str) -> dict:
    return dict(queue=queue, backend="cpu", gpu=None, concurrency=2, device="cpu emulation", total_memory=None,
                driver_version=None, compiler_version=None, arch=None, versions={"attnsweep": "test"},
                hostname="host-a", pid=4242)


def test_the_workers_page_shows_each_worker_and_each_queues_live_workers(live, page, console):
    with session_scope(live.database_url) as s:
        repo.register_worker(s, "alive-1", **_worker("alive-1", "nightly-cpu"))
        repo.register_worker(s, "gone-1", **_worker("gone-1", "nightly-cpu"))
        repo.register_worker(s, "gone-2", **_worker("gone-2", "lonely-gpu"))
    with session_scope(live.database_url) as s:
        repo.heartbeat(s, "gone-1", stopped=True)
        repo.heartbeat(s, "gone-2", stopped=True)
    page.goto(f"{live.url}/dashboard/workers")
    wait_until(page, "document.querySelectorAll('#workers tbody tr[data-worker]').length === 3")
    assert page.locator("#worker-count").inner_text() == "(1 alive of 3)"
    assert page.locator("#workers tr[data-worker='alive-1'] td.state").inner_text() == "alive"
    assert page.locator("#workers tr[data-worker='gone-1'] td.state").inner_text() == "stopped"
    # the first rows are the live ones
    assert page.locator("#workers tbody tr").first.get_attribute("data-worker") == "alive-1"

    wait_until(page, "document.querySelector(\"#queues tr[data-queue='nightly-cpu']\") !== null")
    assert page.locator("#queues tr[data-queue='nightly-cpu'] td.alive").inner_text() == "1"
    # a queue whose workers all stopped reads 0, it does not vanish
    assert page.locator("#queues tr[data-queue='lonely-gpu'] td.alive").inner_text() == "0"
    gauges = page.locator("#store-gauges tbody tr")
    assert gauges.count() == 4 and gauges.first.locator("td.gauge").inner_text() == "0"
    assert page.locator("nav a.here").inner_text() == "Workers"
    screenshot(page, "workers-1440", full_page=True)
    assert console.unexpected() == []
