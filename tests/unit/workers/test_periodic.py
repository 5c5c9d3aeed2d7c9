"""The worker's periodic threads (lease renewal, reconciler, heartbeat) share one loop: a tick
every interval, a tick that raises logged and retried after `retry_s`, stop ends it."""
from __future__ import annotations

import logging
import threading
import time

from workers.periodic import PeriodicThread


def test_ticks_until_stopped_and_a_failing_tick_is_retried_sooner(caplog):
    ticks: list[float] = []
    failed_once = threading.Event()
    three = threading.Event()

    def tick() -> None:
        ticks.append(time.monotonic())
        if not failed_once.is_set():
            failed_once.set()
            raise ConnectionError("broker away\nsecond line")
        if len(ticks) >= 3:
            three.set()

    thread = PeriodicThread("test-periodic", 0.3, tick, what="test tick", retry_s=0.02)
    with caplog.at_level(logging.WARNING, logger="workers.periodic"):
        thread.start()
        assert three.wait(5)
        thread.stop(join_s=5)
    assert not thread._thread.is_alive()
    # The retry after the failure came after retry_s, well before the interval; the next one an interval later.
    assert ticks[1] - ticks[0] < 0.25
    assert ticks[2] - ticks[1] >= 0.29
    assert [r.getMessage() for r in caplog.records] == ["test tick failed: ConnectionError: broker away"]
    count = len(ticks)
    time.sleep(0.4)
    assert len(ticks) == count


def test_stop_before_the_first_interval_runs_no_tick():
    ticks = []
    thread = PeriodicThread("test-periodic", 10.0, lambda: ticks.append(1), what="never")
    thread.start()
    thread.stop(join_s=5)
    assert not thread._thread.is_alive() and ticks == []
