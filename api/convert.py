"""Stored rows to response bodies."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from api.schemas.analysis import GateCheck, RateCell
from api.schemas.sweeps import ConfigRunPublic, SweepPublic
from attnconfig.outcomes import METRIC_KEYS
from store.analysis import BUCKET_SUFFIX, bucket_bounds
from store.models import ConfigRun, Sweep
from store.queries import TIMING_FIELDS
from sweeps.policy import explain_failure


def utc(dt: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if dt is None or dt.tzinfo is not None:
        return dt
    return dt.replace(tzinfo=timezone.utc)


def sweep_public(sweep: Sweep, counts: dict[str, Any], bugs: int | None = None) -> SweepPublic:
    started, last = utc(sweep.started_at), utc(counts.get("last_finished_at"))
    throughput = None
    if started is not None and last is not None and counts["configs_done"]:
        elapsed = (last - started).total_seconds()
        throughput = counts["configs_done"] / elapsed if elapsed > 0 else None
    return SweepPublic(
        id=sweep.id, label=sweep.label, status=sweep.status, backend=sweep.backend, seed=sweep.seed, queue=sweep.queue,
        device=sweep.device, configs_total=counts["configs_total"], configs_done=counts["configs_done"],
        outcomes=counts["outcomes"], not_applicable_reasons=counts["not_applicable_reasons"], filtered=counts["filtered"],
        draws=sweep.draws, splitkv_budget=sweep.splitkv_budget, budget_source=sweep.budget_source, rerun_of=sweep.rerun_of,
        submitted_by=sweep.submitted_by, kernel=sweep.kernel or "attnsweep", kernel_name=sweep.kernel_name,
        kernel_version=sweep.kernel_version,
        error=sweep.error, created_at=utc(sweep.created_at), started_at=started, finished_at=utc(sweep.finished_at),
        throughput=throughput, request=sweep.request, bugs=bugs,
    )


def config_run_public(run: ConfigRun, label: str | None) -> ConfigRunPublic:
    return ConfigRunPublic(
        id=run.id, sweep_id=run.sweep_id, label=label, seq=run.seq, config_hash=run.config_hash, config=run.config,
        data_regime=run.data_regime, state=run.state, outcome=run.outcome, failed_gate=run.failed_gate, detail=run.detail,
        not_applicable_reason=run.not_applicable_reason, rms_threshold=run.rms_threshold,
        threshold_reason=run.threshold_reason, gates=run.gates, backend=run.backend, device=run.device,
        driver_version=run.driver_version, compiler_version=run.compiler_version, variant=run.variant,
        block_n=run.block_n, source_hash=run.source_hash,
        metrics={k: getattr(run, k) for k in METRIC_KEYS}, timings={k: getattr(run, k) for k in TIMING_FIELDS},
        facts=run.facts,
        reproducer=run.reproducer, kernel=run.kernel, kernel_version=run.kernel_version, worker=run.worker,
        attempts=run.attempts, finished_at=utc(run.finished_at),
    )


def gate_check(run: ConfigRunPublic) -> GateCheck:
    """The metric that decided a stored failure against its bound (sweeps.policy.explain_failure)."""
    found = explain_failure(run.config, run.outcome, run.failed_gate, run.metrics, run.gates, run.threshold_reason,
                            run.detail)
    return GateCheck(gate=found.gate, metric=found.metric, value=found.value, bound=found.bound, why=found.why)


def _shown(name: str, value: Any) -> tuple[str, str]:
    """(axis label, filter value) of one group key."""
    if value is None:
        return "none", ""
    if name.endswith(BUCKET_SUFFIX):
        lo, hi = bucket_bounds(value)
        return (str(lo) if lo == hi else f"{lo}-{hi}"), f"{lo}:{hi}"
    if isinstance(value, bool):
        return str(value).lower(), str(value).lower()
    return str(value), str(value)


def rate_cell(group: dict[str, Any]) -> RateCell:
    label, flt = {}, {}
    for name, value in group["key"].items():
        label[name], shown = _shown(name, value)
        if value is not None:
            flt[name.removesuffix(BUCKET_SUFFIX)] = shown
    return RateCell(**group, label=label, filter=flt)
