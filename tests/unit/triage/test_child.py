"""Triage attempts in a child process (isolation/child.py, triage/child_main.py), as the device backends run them: a
fault that poisons the process, a run stuck past its time limit and a dead child each cost that
child, never the triage or the next attempt. The cpu emulation marks itself poisoned on
oob_store as a GPU context is after a sticky error, so the replacement is the real one here."""
from __future__ import annotations

import os
import signal
import time

import pytest

from attnconfig import parse_config
from kernels.backends.base import BackendUnavailable
from triage.attempt import Runner
from isolation.child import GRACE_S

SPLIT = parse_config(dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=1, num_heads_kv=1,
                          head_dim_qk=16, head_dim_v=16, split_kv=2, return_lse=True))


@pytest.fixture
def runner_of():
    """Runner(...) for a test, each closed (its child process ended) when the test ends."""
    made: list[Runner] = []

    def make(*args, **kwargs) -> Runner:
        made.append(Runner(*args, **kwargs))
        return made[-1]

    yield make
    for runner in made:
        runner.close()


def test_a_fault_that_poisons_the_child_is_observed_and_the_child_replaced(runner_of):
    runner = runner_of("cpu", frozenset({"oob_store"}), isolate=True, time_limit_s=30)
    first = runner.run(SPLIT)
    assert first.outcome == "fault" and runner.child.pid is None   # the poisoned child is gone
    again = runner.run(SPLIT)
    assert again.signature == first.signature and runner.child.started == 2


def test_runs_in_one_child_give_the_bits_of_runs_in_this_process(runner_of):
    isolated, local = runner_of("cpu", isolate=True), runner_of("cpu")
    a, b = isolated.run(SPLIT), isolated.run(SPLIT)
    assert a.outcome == "pass" and a.digest == b.digest == local.run(SPLIT).digest
    assert isolated.child.started == 1 and isolated.runs == 2
    assert isolated.compiles(SPLIT) == (True, "")


def test_a_child_stuck_past_its_time_limit_is_killed_and_the_run_is_a_timeout(runner_of):
    runner = runner_of("cpu", isolate=True, time_limit_s=1)
    runner.run(SPLIT)
    stuck = runner.child.pid
    os.kill(stuck, signal.SIGSTOP)   # as a kernel that never returns to Python
    t0 = time.monotonic()
    obs = runner.run(SPLIT)
    assert obs.outcome == "timeout" and "killed" in obs.detail
    assert 1 + GRACE_S <= time.monotonic() - t0 < 1 + GRACE_S + 10
    with pytest.raises(ProcessLookupError):
        os.kill(stuck, 0)
    assert runner.run(SPLIT).outcome == "pass" and runner.child.started == 2


def test_a_child_that_died_between_runs_is_started_again(runner_of):
    runner = runner_of("cpu", isolate=True)
    runner.run(SPLIT)
    os.kill(runner.child.pid, signal.SIGKILL)
    time.sleep(0.2)
    assert runner.run(SPLIT).outcome == "pass" and runner.child.started == 2


def test_a_backend_the_child_cannot_load_is_refused_as_in_this_process(runner_of):
    runner = runner_of("hip", isolate=True)
    with pytest.raises(BackendUnavailable):
        runner.run(SPLIT)


def test_a_triage_task_s_hard_limit_allows_every_classification_run_its_overrun():
    from settings import TRIAGE_RUN_OVERRUN_S, Settings

    assert GRACE_S < TRIAGE_RUN_OVERRUN_S
    s = Settings(triage_clusters=2, triage_shrink_seconds=10, triage_run_time_limit_s=5)
    # Every cluster's shrink, and its 8 runs that may each be killed past their limit.
    assert s.triage_time_limit_s >= 2 * (10 + 8 * (5 + GRACE_S))
