"""Run one config on one backend and judge it: the unit of work of every execution mode.

The CLI's embedded mode, the Celery task and the tests all call `run_config`; queueing,
retries and storage stay outside it. Failures of the config come back as an outcome;
failures of the system (a bug, a broken install) propagate.

On a GPU backend the copies and the kernel run in a thread of their own while this thread
computes the host reference: cuda-bindings waits outside the GIL in every driver call (on the
copies, on the kernel, on a device shared by every process of the host), and numpy computes
outside it. The result is the same either way; only the time differs (timings: run_wall_s is
the device thread's own time, run_wait_s what this thread waited for it after the reference).
"""
from __future__ import annotations

import os
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Mapping

from attnconfig import AttentionConfig
from kernels.backends.base import (
    Backend,
    CompileError,
    DeviceFault,
    DeviceOutOfMemory,
    LaunchError,
    NotApplicable,
    Prepared,
    RunOutput,
)
from reference import attention_lowprec, attention_splitkv, make_inputs, verify_outputs
from sweeps.policy import evaluate_with_gates, gates_for
from sweeps.result import ConfigResult, reproducer_command


_device_thread: tuple[int, ThreadPoolExecutor] | None = None


def _device_executor() -> ThreadPoolExecutor:
    """This process's device thread (made again in a forked child, where the parent's is gone)."""
    global _device_thread
    if _device_thread is None or _device_thread[0] != os.getpid():
        _device_thread = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="device-run"))
    return _device_thread[1]


def _timed_run(backend: Backend, prepared: Prepared, config: AttentionConfig,
               inputs: Mapping[str, Any]) -> tuple[RunOutput, float]:
    t0 = time.perf_counter()
    out = backend.run(prepared, config, inputs)
    return out, time.perf_counter() - t0


def _failure_of(pending: Future | None) -> BaseException | None:
    """The exception the device thread's run ended with (after waiting for it), or None."""
    if pending is None:
        return None
    wait([pending])
    return pending.exception()


def run_config(config: AttentionConfig, backend: Backend, gates: dict[str, Any] | None = None,
               drawn: tuple[Mapping[str, Any], float] | None = None,
               overlap: bool | None = None) -> ConfigResult:
    """Run and judge one config. `gates` defaults to the sweep policy (sweeps.policy.gates_for).
    `drawn`: its make_inputs(config) and the seconds they took, drawn by the caller (while its
    backend loaded); they count in inputs_s and total_s. `overlap`: run the backend in the
    device thread beside the reference (default: where the backend waits on a device)."""
    overlap = backend.waits_on_device if overlap is None else overlap
    gates = gates if gates is not None else gates_for(config)
    drawn_s = drawn[1] if drawn is not None else 0.0
    info = backend.device_info()
    result = ConfigResult(
        config=config,
        outcome="error",
        gates=gates,
        backend=info.backend,
        device=info.device,
        driver_version=info.driver_version,
        compiler_version=info.compiler_version,
        reproducer=reproducer_command(config, info.backend, gates, backend.defects),
    )
    t_start = time.perf_counter()
    timings = result.timings
    pending: Future | None = None
    try:
        t0 = time.perf_counter()
        prepared = backend.prepare(config)
        timings["compile_s"] = time.perf_counter() - t0
        result.variant, result.block_n, result.source_hash = prepared.variant, prepared.block_n, prepared.source_hash

        t0 = time.perf_counter()
        inputs = make_inputs(config) if drawn is None else drawn[0]
        timings["inputs_s"] = time.perf_counter() - t0 + drawn_s

        # run_wall_s, run_wait_s: not stored (config_runs has no column for them), reported by
        # bench/sweep.py: the launch wall time beyond run_s is host-side copying and allocation.
        if overlap:
            pending = _device_executor().submit(_timed_run, backend, prepared, config, inputs)
        else:
            out, timings["run_wall_s"] = _timed_run(backend, prepared, config, inputs)

        t0 = time.perf_counter()
        try:
            # magnitude: the |V| row scales of the row gates, from the reference's own pass.
            ref = attention_splitkv(config, inputs, block_n=prepared.block_n, magnitude=True)
            # Only err_ratio reads it, widened: float32 holds its values without numpy's float16 cast.
            low = attention_lowprec(config, inputs, as_float32=True)
        except Exception:
            # Run one after the other, the device's failure (a launch error, say) would have
            # come first and the reference never run: it still names the outcome.
            device_failure = _failure_of(pending)
            if device_failure is not None:
                raise device_failure from None
            raise
        timings["reference_s"] = time.perf_counter() - t0

        if pending is not None:
            t0 = time.perf_counter()
            out, timings["run_wall_s"] = pending.result()
            timings["run_wait_s"] = time.perf_counter() - t0
        timings["run_s"] = out.run_s
        timings["transfer_s"] = out.transfer_s

        t0 = time.perf_counter()
        metrics = verify_outputs(config, ref, low, out.out, out.lse, out.o_partials, out.lse_partials,
                                 magnitude=ref.row_scales)
        verdict = evaluate_with_gates(config, metrics, gates)
        timings["verify_s"] = time.perf_counter() - t0
        result.metrics.update(metrics)
        result.outcome, result.failed_gate, result.detail = verdict.outcome, verdict.failed_gate, verdict.detail
    except NotApplicable as exc:
        result.outcome, result.not_applicable_reason, result.detail = "not_applicable", exc.reason, exc.detail
    except CompileError as exc:
        result.outcome = "timeout" if exc.timed_out else "error"
        result.detail = f"compile failed: {exc}\n{exc.log}"
    except DeviceFault as exc:
        result.outcome, result.poisons_process = "fault", exc.poisons
        result.detail = f"device fault in {result.variant or 'the kernel'}: {exc}"
        if result.variant is None:   # prepare itself failed: the context was already unusable
            result.outcome, result.detail = "error", f"the device context was unusable before this config ran: {exc}"
    except LaunchError as exc:
        result.outcome, result.detail = "error", f"launch failed: {exc}\n{exc.log}"
    except DeviceOutOfMemory as exc:
        result.outcome, result.detail = "oom", str(exc)
    except MemoryError:
        result.outcome, result.detail = "oom", "host out of memory:\n" + traceback.format_exc(limit=5)
    finally:
        # Whatever stopped this thread (an error, the soft time limit), the device thread
        # finishes this config before anything else touches the backend; a kernel that never
        # does is the time limit's watchdog's to end.
        if pending is not None:
            wait([pending])
    timings["total_s"] = time.perf_counter() - t_start + drawn_s
    return result
