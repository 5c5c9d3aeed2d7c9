"""sweeps.runner: a device backend's run beside the host reference gives the result of running
them one after the other, and its failures still name the outcome."""
from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

import sweeps.runner as runner
from attnconfig import parse_config
from kernels.backends.base import LaunchError
from kernels.backends.cpu import CpuEmulationBackend
from sweeps.runner import run_config
from workers.timelimit import ConfigTimeLimitExceeded, time_limit

CONFIGS = [
    dict(dtype="f16", g=2, seq_len_q=3, seq_len_k=300, num_heads_q=4, num_heads_kv=2, head_dim_qk=16,
         head_dim_v=16, causal=True, return_lse=True, split_kv=4, data_seed=1),
    dict(dtype="bf16", g=1, seq_len_q=1, seq_len_k=1000, num_heads_q=8, num_heads_kv=1, head_dim_qk=32,
         head_dim_v=32, return_lse=True, split_kv=16, data_seed=2),
    dict(dtype="i8", g=1, seq_len_q=5, seq_len_k=77, num_heads_q=2, num_heads_kv=2, head_dim_qk=8,
         head_dim_v=8, split_kv=1, data_seed=3),
]


class RecordingBackend(CpuEmulationBackend):
    """The cpu emulation, noting the thread its run ran in; `gate` (an Event) holds the run
    until it is set, `fail` makes it raise as a faulting kernel does."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False, hold_s: float = 20.0) -> None:
        super().__init__()
        self.gate, self.fail, self.hold_s, self.threads, self.finished = gate, fail, hold_s, [], []

    def run(self, prepared, config, inputs):  # noqa: ANN001, ANN201
        self.threads.append(threading.current_thread().name)
        try:
            if self.gate is not None and not self.gate.wait(timeout=self.hold_s):
                raise LaunchError("the reference never started while the run waited for it")
            if self.fail:
                raise LaunchError("illegal address", log="kernel log")
            return super().run(prepared, config, inputs)
        finally:
            self.finished.append(True)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["f16-causal", "bf16-gqa8", "i8"])
def test_overlapped_and_sequential_runs_give_the_same_result(cfg):
    c = parse_config(cfg)
    backend = CpuEmulationBackend()
    one_by_one = run_config(c, backend, overlap=False)
    side_by_side = run_config(c, backend, overlap=True)
    assert one_by_one.outcome == side_by_side.outcome == "pass"
    assert side_by_side.metrics == one_by_one.metrics
    assert "run_wait_s" in side_by_side.timings and "run_wait_s" not in one_by_one.timings
    assert side_by_side.timings["run_wall_s"] > 0


def test_the_run_goes_on_while_the_reference_computes(monkeypatch):
    # The run cannot finish before the reference has started: one after the other, it
    # would wait forever (20 s here) and fail the config.
    gate = threading.Event()
    real = runner.attention_splitkv

    def reference_starts(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        gate.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "attention_splitkv", reference_starts)
    backend = RecordingBackend(gate)
    result = run_config(parse_config(CONFIGS[0]), backend, overlap=True)
    assert result.outcome == "pass", result.detail
    assert backend.threads == [backend.threads[0]] and backend.threads[0].startswith("device-run")


def test_only_a_device_backend_overlaps_by_default():
    from kernels.backends.device import DeviceBackend

    backend = RecordingBackend()
    result = run_config(parse_config(CONFIGS[2]), backend)
    assert result.outcome == "pass"
    assert backend.threads == [threading.main_thread().name] and "run_wait_s" not in result.timings
    assert DeviceBackend.waits_on_device and not CpuEmulationBackend.waits_on_device


def test_a_failing_run_names_the_outcome_even_when_the_reference_fails_too(monkeypatch):
    def out_of_memory(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise MemoryError("the reference's arrays")

    c = parse_config(CONFIGS[0])
    plain = run_config(c, RecordingBackend(fail=True), overlap=True)
    assert plain.outcome == "error" and "launch failed: illegal address" in plain.detail
    monkeypatch.setattr(runner, "attention_splitkv", out_of_memory)
    both = run_config(c, RecordingBackend(fail=True), overlap=True)
    assert both.outcome == "error" and "launch failed: illegal address" in both.detail
    host_only = run_config(c, RecordingBackend(), overlap=True)
    assert host_only.outcome == "oom" and "host out of memory" in host_only.detail


def _run_in_child(queue) -> None:  # noqa: ANN001
    result = run_config(parse_config(CONFIGS[1]), CpuEmulationBackend(), overlap=True)
    queue.put(result.outcome)


def test_a_forked_child_gets_a_device_thread_of_its_own():
    # The parent's thread does not survive a fork; an executor inherited as it is would take
    # the child's run and never start it.
    assert run_config(parse_config(CONFIGS[1]), CpuEmulationBackend(), overlap=True).outcome == "pass"
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_run_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's overlapped run never finished")
    assert queue.get(timeout=5) == "pass"


def test_the_setting_reaches_the_embedded_workers(monkeypatch):
    import workers.embedded as embedded

    monkeypatch.setenv("ATTNSWEEP_OVERLAP_DEVICE", "1")
    assert embedded.ProcessSettings.now().overlap is None   # the backend decides: a GPU one overlaps
    monkeypatch.delenv("ATTNSWEEP_OVERLAP_DEVICE")
    assert embedded.ProcessSettings.now().overlap is False  # the default: one after the other


@pytest.mark.timeout(120)
def test_a_bad_process_setting_fails_the_sweep_in_the_parent(sqlite_url, monkeypatch):
    # Read in a pool's initializer, it would fail there and the pool would start the process
    # again, forever.
    from pydantic import ValidationError

    from store import repo
    from store.db import session_scope
    from store.migrate import upgrade
    from workers.embedded import execute_sweep
    from sweeps.plan import plan_sweep
    from sweeps.spec import SweepSpec

    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sweep_id, _ = plan_sweep(s, SweepSpec(samples=2, seed=3, backend="cpu"), device_total_memory=None, device=None)
    monkeypatch.setenv("ATTNSWEEP_HEAP_RETAIN_MB", "4096")
    with pytest.raises(ValidationError, match="heap_retain_mb"):
        execute_sweep(sqlite_url, sweep_id, "cpu", jobs=2)
    with session_scope(sqlite_url) as s:
        assert repo.sweep_status(s, sweep_id) == "failed"
        assert len(repo.queued_configs(s, sweep_id)) == 2   # nothing ran, nothing lost


def test_bench_counts_what_the_worker_waited_for_an_overlapped_run():
    from bench.sweep import summarize
    from sweeps.result import ConfigResult

    c = parse_config(CONFIGS[2])

    def result(**timings):  # noqa: ANN003, ANN202
        r = ConfigResult(config=c, outcome="pass", gates={}, backend="cuda", device="gpu")
        r.timings.update(dict(compile_s=0.0, inputs_s=0.1, reference_s=0.2, verify_s=0.05, store_s=0.0,
                              run_s=0.001, transfer_s=0.02, total_s=0.4), **timings)
        return r

    summary = summarize([result(run_wall_s=0.03, run_wait_s=0.005), result(run_wall_s=0.04)],
                        wall=1.0, jobs=1, sweep_id=1, warmup=None)
    assert summary["phases_s"]["transfers+kernel"] == pytest.approx(0.045)   # waited, then not overlapped
    assert summary["inside_run_s"]["device thread (beside the reference)"] == pytest.approx(0.03)
    alone = summarize([result(run_wall_s=0.04)], wall=1.0, jobs=1, sweep_id=1, warmup=None)
    assert alone["phases_s"]["transfers+kernel"] == pytest.approx(0.04)
    assert "device thread (beside the reference)" not in alone["inside_run_s"]


def test_the_soft_time_limit_stops_the_wait_and_leaves_no_run_behind():
    # A run that takes 1.5 s (a kernel that is slow, not hung) under a 0.2 s limit: the limit
    # fires while this thread waits for it, and run_config returns only once the device thread
    # is done with the backend (a timed-out worker drops and closes it next).
    backend = RecordingBackend(threading.Event(), hold_s=1.5)
    hard = []
    with pytest.raises(ConfigTimeLimitExceeded):
        with time_limit(0.2, 30.0, lambda: hard.append(True)):
            run_config(parse_config(CONFIGS[2]), backend, overlap=True)
    assert backend.finished == [True] and hard == []
