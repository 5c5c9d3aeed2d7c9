"""sweeps.runner: the run and the host reference one after the other in the calling thread; a
failure of either names the outcome, and the soft time limit stops a slow run."""
from __future__ import annotations

import threading
import time

import pytest

import sweeps.runner as runner
from attnconfig import parse_config
from kernels.backends.base import LaunchError
from kernels.backends.cpu import CpuEmulationBackend
from sweeps.runner import run_config
from isolation.timelimit import ConfigTimeLimitExceeded, time_limit

CONFIGS = [
    dict(dtype="f16", g=2, seq_len_q=3, seq_len_k=300, num_heads_q=4, num_heads_kv=2, head_dim_qk=16,
         head_dim_v=16, causal=True, return_lse=True, split_kv=4, data_seed=1),
    dict(dtype="bf16", g=1, seq_len_q=1, seq_len_k=1000, num_heads_q=8, num_heads_kv=1, head_dim_qk=32,
         head_dim_v=32, return_lse=True, split_kv=16, data_seed=2),
    dict(dtype="i8", g=1, seq_len_q=5, seq_len_k=77, num_heads_q=2, num_heads_kv=2, head_dim_qk=8,
         head_dim_v=8, split_kv=1, data_seed=3),
]


class RecordingBackend(CpuEmulationBackend):
    """The cpu emulation, noting the thread its run ran in; `hold_s` makes the run take that
    long, `fail` makes it raise as a faulting kernel does."""

    def __init__(self, fail: bool = False, hold_s: float = 0.0) -> None:
        super().__init__()
        self.fail, self.hold_s, self.threads, self.finished = fail, hold_s, [], []

    def run(self, prepared, config, inputs):  # noqa: ANN001, ANN201
        self.threads.append(threading.current_thread().name)
        try:
            if self.hold_s:
                time.sleep(self.hold_s)
            if self.fail:
                raise LaunchError("illegal address", log="kernel log")
            return super().run(prepared, config, inputs)
        finally:
            self.finished.append(True)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["f16-causal", "bf16-gqa8", "i8"])
def test_a_correct_run_passes_in_the_calling_thread(cfg):
    backend = RecordingBackend()
    result = run_config(parse_config(cfg), backend)
    assert result.outcome == "pass", result.detail
    assert backend.threads == [threading.current_thread().name]
    assert result.timings["run_wall_s"] > 0 and "run_wait_s" not in result.timings


def test_a_failing_run_names_the_outcome_and_a_failing_reference_its_own(monkeypatch):
    def out_of_memory(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise MemoryError("the reference's arrays")

    c = parse_config(CONFIGS[0])
    plain = run_config(c, RecordingBackend(fail=True))
    assert plain.outcome == "error" and "launch failed: illegal address" in plain.detail
    monkeypatch.setattr(runner, "attention_splitkv", out_of_memory)
    both = run_config(c, RecordingBackend(fail=True))
    assert both.outcome == "error" and "launch failed: illegal address" in both.detail   # the run came first
    host_only = run_config(c, RecordingBackend())
    assert host_only.outcome == "oom" and "host out of memory" in host_only.detail


@pytest.mark.timeout(120)
def test_a_bad_process_setting_fails_the_sweep_in_the_parent(sqlite_url, monkeypatch):
    # Read in a pool's initializer, it would fail there and the pool would start the process
    # again, forever.
    from pydantic import ValidationError

    from store import repo
    from store.db import session_scope, unit_of_work
    from store.migrate import upgrade
    from sweeps.plan import plan_sweep
    from sweeps.spec import SweepSpec
    from workers.embedded import execute_sweep

    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sweep_id = repo.store_plan(s, plan_sweep(SweepSpec(samples=2, seed=3, backend="cpu"), device_total_memory=None)).id
    monkeypatch.setenv("ATTNSWEEP_CONFIG_TIME_GRACE_S", "-1")
    with pytest.raises(ValidationError, match="config_time_grace_s"):
        with unit_of_work(sqlite_url) as session:
            execute_sweep(session, sweep_id, "cpu", jobs=2)
    with session_scope(sqlite_url) as s:
        assert repo.sweep_status(s, sweep_id) == "failed"
        assert len(repo.queued_configs(s, sweep_id)) == 2   # nothing ran, nothing lost


def test_the_soft_time_limit_stops_a_slow_run():
    # A run that takes 1.5 s (a kernel that is slow, not hung) under a 0.2 s limit: the limit
    # fires inside it, and the watchdog's hard limit never does.
    backend = RecordingBackend(hold_s=1.5)
    hard = []
    with pytest.raises(ConfigTimeLimitExceeded):
        with time_limit(0.2, 30.0, lambda: hard.append(True)):
            run_config(parse_config(CONFIGS[2]), backend)
    assert backend.finished == [True] and hard == []
