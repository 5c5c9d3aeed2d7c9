"""The per-config time limit runs on the time the config ran: a process stopped for longer than
the limit (SIGSTOP, as when frozen or swapped out), or kept waiting for a CPU by other
processes, does not time out its config, and a config that really runs past the limit still does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from isolation.timelimit import ConfigTimeLimitExceeded, time_limit

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import sys, time
from isolation.timelimit import ConfigTimeLimitExceeded, time_limit
steps, busy = int(sys.argv[1]), float(sys.argv[2])
try:
    with time_limit(1.0, 30.0, lambda: print("hard", flush=True)) as clock:
        print("started", flush=True)
        for _ in range(steps):
            time.sleep(0.05)
        t0 = time.thread_time()
        while time.thread_time() - t0 < busy:   # `busy` s of this thread's CPU time
            pass
    print(f"finished after {clock.ran:.2f} s of running", flush=True)
except ConfigTimeLimitExceeded:
    print("timeout", flush=True)
"""


def _run(steps: int, stop_s: float, busy: float = 0.0, cpu: int | None = None) -> str:
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(steps), str(busy)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=pin)
    assert proc.stdout.readline().strip() == "started"
    if stop_s:
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(stop_s)
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    return out.strip()


def test_time_stopped_does_not_count_towards_the_limit():
    out = _run(12, stop_s=2.5)   # 0.6 s of work, 2.5 s frozen: 3.1 s of wall clock against a 1 s limit
    assert out.startswith("finished"), out
    assert float(out.split()[2]) < 1.0, out


def test_time_spent_waiting_for_a_cpu_does_not_count():
    """0.5 s of CPU work on a CPU that four busy processes share with it: about 2.5 s of wall
    clock against a 1 s limit, yet half a second of running."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    spin = "import os, time\nos.sched_setaffinity(0, {%d})\nend = time.monotonic() + 8\nwhile time.monotonic() < end: pass" % cpu
    burners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(4)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        out = _run(0, stop_s=0, busy=0.5, cpu=cpu)
        wall = time.monotonic() - t0
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert out.startswith("finished"), out
    assert wall > 1.2, f"the CPU was not contended ({wall:.2f} s): the test shows nothing"


def test_a_config_that_runs_past_the_limit_still_times_out():
    assert _run(40, stop_s=0) == "timeout"   # 2 s of work


def test_without_a_hard_limit_only_the_main_thread_is_stopped():
    """Triage's use: a soft limit and no watchdog's hard limit. Off the main thread no signal can
    stop the run, and nothing else does."""
    with pytest.raises(ConfigTimeLimitExceeded, match="0.05 s"):
        with time_limit(0.05):
            time.sleep(2)
    with time_limit(None) as clock:
        time.sleep(0.1)
    assert clock.ran == 0.0   # no limit: nothing ticks
    finished = []

    def off_main() -> None:
        with time_limit(0.05):
            time.sleep(0.3)
        finished.append(True)

    worker = threading.Thread(target=off_main)
    worker.start()
    worker.join(5)
    assert finished == [True]
