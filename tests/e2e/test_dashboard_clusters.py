"""The sweep page's bugs panel in headless Chromium: "triage pending" until the sweep's clusters
are stored, then one card per cluster (count, explanation, its symptoms, classification, first
bad commit, the minimal reproducer with a working copy button), above the failure table."""
from __future__ import annotations

from store import clusters as stored
from store.db import session_scope
from tests.e2e import seed
from tests.e2e.conftest import screenshot, wait_until
from triage.sweep import triage_sweep

FIRST_BAD = "0123456789abcdef0123456789abcdef01234567"
DETERMINISTIC = {"kind": "deterministic", "repeats": 3, "same_input_failing": 3, "distinct_outputs": 1,
                 "seeds": [1, 2, 3, 4], "seeds_failing": [1, 2, 3, 4], "runs": 7}


def _triaged(url: str, sweep_id: int) -> list[dict]:
    """The seeded sweep's real clusters and explanations (nothing run: its results are planted),
    the largest classified and bisected as a worker would store them."""
    with session_scope(url) as s:
        found = [c.to_dict() for c in triage_sweep(s, sweep_id, shrink_configs=False, classify_configs=False)]
    found[0].update(classification=DETERMINISTIC, first_bad_commit=FIRST_BAD)
    return found


def test_clusters_panel_shows_pending_then_every_bug_with_a_copyable_reproducer(live, page, console):
    nightly = seed.seed_finished(live.database_url, label="nightly")
    page.goto(f"{live.url}/dashboard/sweeps/{nightly.sweep_id}")
    page.wait_for_selector("#failures tbody tr")
    wait_until(page, "document.getElementById('clusters-panel').dataset.status === 'pending'")
    assert "triage pending" in page.locator("#triage-state").inner_text()
    assert page.locator("#clusters .cluster").count() == 0

    clusters = _triaged(live.database_url, nightly.sweep_id)
    with session_scope(live.database_url) as s:
        stored.store_clusters(s, nightly.sweep_id, clusters)
    wait_until(page, "document.getElementById('clusters-panel').dataset.status === 'done'")
    failing = len(nightly.failures())
    assert sum(c["size"] for c in clusters) == failing
    # The planted symptoms (rms, row, nan, error) of bf16 with split_kv >= 16 are one bug.
    assert len(clusters) == 1 and set(clusters[0]["signatures"]) > {clusters[0]["signature"]["outcome"] + "/rms/rowwise"}
    assert page.locator("#clusters-summary").inner_text() == f"1 bug in {failing} failing configs"
    cards = page.locator("#clusters .cluster")
    assert cards.count() == 1
    first = cards.nth(0)
    assert first.locator(".cluster-size").inner_text() == f"{clusters[0]['size']} failing"
    sig = clusters[0]["signature"]   # the planted results expose no partials: located at their family
    assert first.locator("h3 code").inner_text() == f"{sig['outcome']}/{sig['gate'] or '-'}/rowwise" == \
        f"{sig['outcome']}/{sig['gate'] or '-'}/{sig['location']}"
    assert first.locator(".explanation").inner_text() == clusters[0]["explanation"]["summary"]
    # Every symptom the bug showed, the most frequent first.
    counts = sorted(clusters[0]["signatures"].items(), key=lambda kv: (-kv[1], kv[0]))
    assert first.locator(".signatures").inner_text() == ", ".join(f"{label} {n}" for label, n in counts)
    assert "dtype=bf16" in clusters[0]["explanation"]["conditions"]
    assert first.locator(".classification").inner_text() == "deterministic"
    assert first.locator(".first-bad").inner_text() == FIRST_BAD
    assert first.locator("pre.reproducer").inner_text() == clusters[0]["reproducer"]

    first.locator("button.copy").click()
    wait_until(page, "document.querySelector('#clusters .cluster button.copy').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == clusters[0]["reproducer"]

    panel = page.locator("#clusters-panel").bounding_box()
    table = page.locator("#failures").bounding_box()
    assert panel["y"] + panel["height"] <= table["y"]
    screenshot(page.locator("#clusters-panel"), "sweep-clusters")
    assert console.unexpected() == []


def test_a_failed_triage_says_why(live, page, console):
    nightly = seed.seed_finished(live.database_url, label="nightly")
    with session_scope(live.database_url) as s:
        stored.fail_triage(s, nightly.sweep_id, "BackendUnavailable: no GPU on this worker")
    page.goto(f"{live.url}/dashboard/sweeps/{nightly.sweep_id}")
    wait_until(page, "document.getElementById('clusters-panel').dataset.status === 'failed'")
    assert page.locator("#triage-state").inner_text() == "triage failed: BackendUnavailable: no GPU on this worker"
    assert console.unexpected() == []
