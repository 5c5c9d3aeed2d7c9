"""Run one config on one backend and judge it: the unit of work of every execution mode.

The CLI's embedded mode, the Celery task and the tests all call `run_config`; queueing,
retries and storage stay outside it. Failures of the config come back as an outcome;
failures of the system (a bug, a broken install) propagate.

The backend's run (copies and kernel) and the host reference run one after the other, in the
calling thread: with every core running a worker process, the pool already overlaps one
process's device waits with the others' host work (docs/decisions.md, sweep throughput).
"""
from __future__ import annotations

import time
import traceback
from typing import Any, Mapping

from attnconfig import AttentionConfig
from kernels.backends.base import (
    Backend,
    CompileError,
    ConfinementError,
    ConfinementTimeout,
    DeviceFault,
    DeviceOutOfMemory,
    LaunchError,
    NotApplicable,
    PluginError,
    Prepared,
    RunOutput,
)
from reference import attention_lowprec, attention_splitkv, make_inputs, verify_outputs
from reference.facts import numeric_facts
from sweeps.datacache import DataCache
from sweeps.policy import evaluate_with_gates, gates_for
from sweeps.result import ConfigResult, new_result


def _timed_run(backend: Backend, prepared: Prepared, config: AttentionConfig,
               inputs: Mapping[str, Any]) -> tuple[RunOutput, float]:
    t0 = time.perf_counter()
    out = backend.run(prepared, config, inputs)
    return out, time.perf_counter() - t0


def run_config(config: AttentionConfig, backend: Backend, gates: dict[str, Any] | None = None,
               drawn: tuple[Mapping[str, Any], float] | None = None, data: DataCache | None = None) -> ConfigResult:
    """Run and judge one config. `gates` defaults to the sweep policy (sweeps.policy.gates_for).
    `drawn`: its make_inputs(config) and the seconds they took, drawn by the caller (while its
    backend loaded); they count in inputs_s and total_s. `data`: the host's cache of inputs and
    references (sweeps/datacache.py), which returns the bytes the computation would; None: computed
    here. Timings inputs_cached and reference_cached (1.0 or 0.0) say what came from it."""
    gates = gates if gates is not None else gates_for(config)
    drawn_s = drawn[1] if drawn is not None else 0.0
    info = backend.device_info()
    result = new_result(config, gates, info.backend, backend.defects, info)
    t_start = time.perf_counter()
    timings = result.timings
    try:
        t0 = time.perf_counter()
        prepared = backend.prepare(config)
        timings["compile_s"] = time.perf_counter() - t0
        result.variant, result.block_n, result.source_hash = prepared.variant, prepared.block_n, prepared.source_hash
        # The project's own kernels are versioned by the source they compiled (or emulate).
        result.kernel_version = result.kernel_version or (prepared.source_hash or "")[:12]

        t0 = time.perf_counter()
        if drawn is not None:
            inputs = drawn[0]
        elif data is not None:
            inputs, hit = data.inputs(config)
            timings["inputs_cached"] = float(hit)
        else:
            inputs = make_inputs(config)
        timings["inputs_s"] = time.perf_counter() - t0 + drawn_s

        # run_wall_s: not stored (config_runs has no column for it), reported by bench/sweep.py:
        # the launch wall time beyond run_s is host-side copying and allocation.
        out, timings["run_wall_s"] = _timed_run(backend, prepared, config, inputs)

        t0 = time.perf_counter()
        if data is not None:   # the same two computations as below, or their stored bytes
            ref, low, hit = data.reference(config, inputs, prepared.block_n)
            timings["reference_cached"] = float(hit)
        else:
            # magnitude: the |V| row scales of the row gates, from the reference's own pass.
            ref = attention_splitkv(config, inputs, block_n=prepared.block_n, magnitude=True)
            # Only err_ratio reads it, widened: float32 holds its values without numpy's float16 cast.
            low = attention_lowprec(config, inputs, as_float32=True)
        timings["reference_s"] = time.perf_counter() - t0

        timings["run_s"] = out.run_s
        timings["transfer_s"] = out.transfer_s

        t0 = time.perf_counter()
        metrics = verify_outputs(config, ref, low, out.out, out.lse, out.o_partials, out.lse_partials,
                                 magnitude=ref.row_scales)
        verdict = evaluate_with_gates(config, metrics, gates)
        timings["verify_s"] = time.perf_counter() - t0
        result.metrics.update(metrics)
        # Not gated and not a column of the store: what sweeps.coverage buckets (fact_* keys).
        result.metrics.update(numeric_facts(config, inputs, ref.lse_f32))
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
    except PluginError as exc:
        result.outcome, result.detail = "error", f"kernel {result.kernel}: {exc}"
    except ConfinementTimeout as exc:
        result.outcome, result.detail = "timeout", f"confined run: {exc}"
    except ConfinementError as exc:
        result.outcome, result.detail = "error", f"confined run: {exc}"
    timings["total_s"] = time.perf_counter() - t_start + drawn_s
    return result
