"""Accepting a sweep: resolve the budget, sample and prefilter, store in one transaction, then enqueue.

Planning is sweeps.plan.plan_sweep, as in the embedded mode (its configs go in with one COPY
on PostgreSQL: a 10,000-config sweep is stored and queued in about a second). The sweep and all its configs are
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
from store.models import Sweep
from sweeps.plan import plan_sweep
from sweeps.sampler import SamplingExhausted
from sweeps.spec import SweepSpec
from workers.app import queue_kind
from workers.enqueue import enqueue_configs

log = logging.getLogger(__name__)


def bounded_draws(spec: SweepSpec, settings: Settings) -> SweepSpec:
    """The spec with its draws capped at ATTNSWEEP_MAX_DRAWS: a larger max_draws is a 422, the
    default (1000 * samples) is cut to the cap, so no request holds an API thread for long."""
    cap = settings.max_draws
    if spec.max_draws is not None and spec.max_draws > cap:
        raise ProblemError([("max_draws", f"max_draws={spec.max_draws}: must be <= {cap} (ATTNSWEEP_MAX_DRAWS)")])
    if spec.samples > cap:
        raise ProblemError([("samples", f"samples={spec.samples}: must be <= {cap} (ATTNSWEEP_MAX_DRAWS)")])
    if spec.max_draws is None and spec.resolved_max_draws() > cap:
        return spec.model_copy(update={"max_draws": cap})
    return spec


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
    if not explicit:
        spec = bounded_draws(spec, settings)
    queue = settings.queue_name(queue_kind(spec.backend))
    memory, device = repo.queue_device_memory(session, queue, settings.worker_stale_s)
    request_extra = {"defects": list(body.defects), **(extra_request or {}), **({"configs": len(configs)} if explicit else {})}
    try:
        sweep_id, sampled = plan_sweep(session, spec, device_total_memory=memory, device=device,
                                       configs=configs, request_extra=request_extra)
    except SamplingExhausted as exc:
        raise ProblemError([("max_draws", str(exc))]) from None
    if sampled is not None:
        configs = sampled.configs
    filtered, draws = (sampled.filtered, sampled.draws) if sampled is not None else ({}, 0)
    sweep = session.get(Sweep, sweep_id)
    sweep.queue, sweep.rerun_of = queue, rerun_of
    session.commit()

    items = [(c.content_hash(), c.to_dict(), c) for c in configs]
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
        id=sweep.id, status=sweep.status, queue=queue, configs_total=len(items), tasks=tasks, seed=sweep.seed, draws=draws,
        filtered=filtered, splitkv_budget=sweep.splitkv_budget, budget_source=sweep.budget_source,
    )
