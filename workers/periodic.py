"""A daemon thread of the worker's main process that does one thing every few seconds until
stopped: renew task leases (workers/lease.py), reconcile (workers/outbox.py), beat the worker's
heart (workers/registry.py). A tick that raises (broker or database away) is logged and never
ends the thread or the worker; the next tick comes after `retry_s` (default: the interval)."""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class PeriodicThread:
    def __init__(self, name: str, interval_s: float, tick: Callable[[], None], *, what: str,
                 retry_s: float | None = None):
        self.interval_s = interval_s
        self.retry_s = interval_s if retry_s is None else retry_s
        self.tick = tick
        self.what = what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_s: float = 0.0) -> None:
        """Stop after the tick in progress; wait up to `join_s` seconds for it."""
        self._stop.set()
        if join_s and self._thread.is_alive():
            self._thread.join(timeout=join_s)

    def _loop(self) -> None:
        interval = self.interval_s
        while not self._stop.wait(interval):
            try:
                self.tick()
                interval = self.interval_s
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                first = str(exc).splitlines()[0] if str(exc) else ""
                log.warning("%s failed: %s: %s", self.what, type(exc).__name__, first)
                interval = self.retry_s
