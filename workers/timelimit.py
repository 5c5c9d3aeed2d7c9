"""The per-config time limit of a worker: a soft limit that raises, and a watchdog behind it.

The soft limit is SIGALRM in the worker's main thread: Python code (and numpy between two
calls) stops with `ConfigTimeLimitExceeded`, the worker records `timeout` and moves on.
Code stuck in C (a kernel that never finishes inside a driver's synchronize) never returns
to Python; for that a watchdog thread fires `grace_s` later, records `timeout` for the
config itself and ends the process: Celery starts a fresh one and, since the task is
acknowledged late and rejected on worker loss, delivers the batch again, whose recorded
configs are then skipped.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class ConfigTimeLimitExceeded(BaseException):
    """A config ran past its limit. A BaseException, so no `except Exception` swallows it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"exceeded the per-config time limit of {seconds:g} s")


@contextmanager
def time_limit(seconds: float, grace_s: float, on_hard_timeout: Callable[[], None]) -> Iterator[None]:
    """Raise ConfigTimeLimitExceeded after `seconds`; call `on_hard_timeout` (another thread) after `seconds + grace_s`."""
    if seconds <= 0:
        yield
        return
    use_signal = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous = None
    if use_signal:
        def _expire(_signum, _frame):  # noqa: ANN001
            raise ConfigTimeLimitExceeded(seconds)

        previous = signal.signal(signal.SIGALRM, _expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog = threading.Timer(seconds + grace_s, on_hard_timeout)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        if use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
