"""The time limit of one config's run, on the time the config itself ran: a soft limit that
raises, and a watchdog behind it. A worker's executor (isolation.executor) and triage's runs
(triage.attempt) both use it; triage sets no hard limit (a hung kernel there runs in a child
process that its parent kills, isolation.child).

The clock is the config's own running time, not the wall clock: a worker frozen (SIGSTOP) or
swapped out for minutes, or a machine too busy to give it a CPU, must not find its config timed
out when it runs again; a timeout is a verdict on the kernel. A watchdog thread ticks every
TICK_S on the monotonic clock and takes off what the config's thread spent waiting for a CPU
(the kernel's run-queue delay of that thread, /proc/self/task/TID/schedstat). Time the thread
spends blocked (a device's synchronize, a sleep) counts. A tick that comes more than LATE_S late
means the whole process did not run for a while (stopped: that is no run-queue wait): the gap
counts only the CPU time the process used in it (at least one tick), so code computing in C
while holding the GIL (the tick waits for it, the CPU time goes on) still reaches its limit.

At `seconds` of running time the watchdog interrupts the main thread with SIGALRM: Python code
(and numpy between two calls) stops with `ConfigTimeLimitExceeded`, the worker records
`timeout` and moves on. Code stuck in C (a kernel that never finishes inside a driver's
synchronize) never returns to Python; for that the watchdog calls `on_hard_timeout`, where one
is given, `grace_s` of running time later. A worker's records `timeout` for the config itself
and ends the process (isolation.executor): Celery starts a fresh one and, since the task is
acknowledged late and rejected on worker loss, delivers the batch again, whose recorded configs
are then skipped.
"""
from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

TICK_S = 0.1   # how often the watchdog reads the clocks (more often under a shorter limit)
LATE_S = 1.0   # a tick this much past due: the process was stopped, swapped out or starved


class ConfigTimeLimitExceeded(BaseException):
    """A config ran past its limit. A BaseException, so no `except Exception` swallows it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"exceeded the per-config time limit of {seconds:g} s")


def timeout_detail(exc: ConfigTimeLimitExceeded, first_line: str | None = None) -> str:
    """The detail of a config its limit stopped: `first_line` (default: the limit), then the
    notes the backend added on where the limit stopped it, where it knows (the cpu emulation's
    combine); triage locates a timeout by them."""
    return "\n".join([first_line or str(exc), *getattr(exc, "__notes__", ())])


def run_queue_wait(tid: int) -> float:
    """Seconds thread `tid` of this process has waited runnable for a CPU (0 where Linux's
    schedstat is not there to read)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class RunClock:
    """Seconds the thread that started the clock ran (or waited on anything but a CPU), read
    by `tick` every tick_s or so."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self.ran = 0.0
        self.tid = threading.get_native_id()
        self._wall, self._cpu, self._queued = time.monotonic(), time.process_time(), run_queue_wait(self.tid)

    def tick(self) -> float:
        wall, cpu, queued = time.monotonic(), time.process_time(), run_queue_wait(self.tid)
        elapsed, used = wall - self._wall, cpu - self._cpu
        ran = max(0.0, elapsed - (queued - self._queued))
        self._wall, self._cpu, self._queued = wall, cpu, queued
        if elapsed > self.tick_s + LATE_S:
            ran = max(self.tick_s, min(ran, used))
        self.ran += ran
        return self.ran


@contextmanager
def time_limit(seconds: float | None, grace_s: float = 0.0,
               on_hard_timeout: Callable[[], None] | None = None) -> Iterator[RunClock]:
    """Raise ConfigTimeLimitExceeded after `seconds` of running time (None or 0: no limit), in
    the main thread only; call `on_hard_timeout`, if given, (from the watchdog thread) after
    `seconds + grace_s`. Yields the clock."""
    seconds = seconds or 0.0
    clock = RunClock(min(TICK_S, max(0.005, seconds / 4)))
    use_signal = threading.current_thread() is threading.main_thread()
    if seconds <= 0 or not (use_signal or on_hard_timeout is not None):
        yield clock
        return
    main_id = threading.get_ident()
    previous = None
    if use_signal:
        def _expire(_signum, _frame):  # noqa: ANN001
            raise ConfigTimeLimitExceeded(seconds)

        previous = signal.signal(signal.SIGALRM, _expire)
    stop = threading.Event()

    def watch() -> None:
        soft_sent = False
        while not stop.wait(clock.tick_s):
            ran = clock.tick()
            if use_signal and not soft_sent and ran >= seconds:
                soft_sent = True
                signal.pthread_kill(main_id, signal.SIGALRM)
            if on_hard_timeout is not None and ran >= seconds + grace_s:
                on_hard_timeout()
                return

    watchdog = threading.Thread(target=watch, name="attnsweep-config-watchdog", daemon=True)
    watchdog.start()
    try:
        yield clock
    finally:
        stop.set()
        if watchdog is not threading.current_thread():
            watchdog.join(timeout=5)
        if use_signal:
            signal.signal(signal.SIGALRM, previous)
