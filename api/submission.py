"""Accepting a sweep: resolve the budget, sample and prefilter, store in one transaction, then enqueue.

The same steps as sweeps.plan.plan_sweep (its `resolve_budget`, the sampler, repo.create_sweep),
except that the configs go in with one COPY on PostgreSQL (repo.bulk_add_configs): a
10,000-config sweep is stored and queued in about a second. The sweep and all its configs are
committed together (nothing half-written); only then are the configs published, so a worker
never receives a config the database does not hold. If publishing fails the sweep is marked
`failed` with the broker's error, and workers skip any of its batches that reached the queue.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from fastapi import HTTPException, status
from sqlalchemy.orm import Session

from api.errors import ProblemError
from api.schemas.sweeps import SweepAccepted, SweepCreate
from attnconfig import AttentionConfig
from core.settings import Settings
from store import repo
from sweeps.plan import resolve_budget
from sweeps.sampler import SamplingExhausted, sample
from workers.app import queue_kind
from workers.enqueue import enqueue_configs

log = logging.getLogger(__name__)


def submit_sweep(session: Session, celery: Celery, settings: Settings, body: SweepCreate, *,
                 configs: list[AttentionConfig] | None = None, rerun_of: int | None = None,
                 extra_request: dict[str, Any] | None = None) -> SweepAccepted:
    spec = body.spec()
    configs = configs if configs is not None else body.configs
    explicit = configs is not None
    wanted = len(configs) if explicit else spec.samples
    if wanted > settings.max_sweep_configs:
        field = "configs" if explicit else "samples"
        raise ProblemError([(field, f"{field}: {wanted} configs exceed the limit of {settings.max_sweep_configs} (ATTNSWEEP_MAX_SWEEP_CONFIGS)")])
    queue = settings.queue_name(queue_kind(spec.backend))
    memory, device = repo.queue_device_memory(session, queue, settings.worker_stale_s)
    budget = resolve_budget(spec, memory)
    filtered: dict[str, int] = {}
    draws = 0
    if not explicit:
        try:
            sampled = sample(spec, budget.bytes)
        except SamplingExhausted as exc:
            raise ProblemError([("max_draws", str(exc))]) from None
        configs, filtered, draws = sampled.configs, sampled.filtered, sampled.draws
    request = {**spec.model_dump(mode="json"), "defects": list(body.defects), **(extra_request or {}),
               **({"configs": len(configs)} if explicit else {})}
    sweep = repo.create_sweep(session, request=request, seed=spec.resolved_seed(), backend=spec.backend, label=spec.label,
                              splitkv_budget=budget.bytes, budget_source=budget.source, device=device, draws=draws,
                              filtered=filtered, configs=[])
    rows = [repo.config_columns(c) for c in configs]
    repo.bulk_add_configs(session, sweep.id, rows)
    sweep.samples = sweep.configs_total = len(rows)
    sweep.queue, sweep.rerun_of = queue, rerun_of
    session.commit()

    items = [(r["config_hash"], r["config"], c) for r, c in zip(rows, configs)]
    try:
        tasks = enqueue_configs(celery, settings, sweep_id=sweep.id, backend=spec.backend, configs=items,
                                defects=body.defects, err_ratio_gate=spec.err_ratio_gate)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the sweep is marked, the client told
        log.exception("enqueueing sweep %s failed", sweep.id)
        repo.set_status(session, sweep.id, "failed", error=f"enqueueing failed: {exc!r}")
        session.commit()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            f"sweep {sweep.id} was stored but the broker refused its configs: {exc}") from exc
    return SweepAccepted(
        id=sweep.id, status=sweep.status, queue=queue, configs_total=len(rows), tasks=tasks, seed=sweep.seed, draws=draws,
        filtered=filtered, splitkv_budget=sweep.splitkv_budget, budget_source=sweep.budget_source,
    )
