"""Start the sweep of a pushed commit: read its kernels/src, store the bundle, plan, enqueue first.

One transaction holds the bundle (if new), the sweep, its configs and the delivery id, so a
request refused on the way stores nothing, and two deliveries with one id (a replay racing
the original) cannot both start a sweep: the second hits the delivery's primary key and
answers with the first one's sweep. Only after the commit are the configs published, with the
CI priority (workers.app) so they run before queued nightly sweeps.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from celery import Celery
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ci.events import CiEvent
from core.settings import Settings
from kernelsrc.bundles import save_bundle
from kernelsrc.git import read_kernels
from store import repo
from store.models import CiDelivery, Sweep
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec
from workers.app import CI_PRIORITY, queue_kind
from workers.enqueue import enqueue_configs

log = logging.getLogger(__name__)


class BrokerRefused(RuntimeError):
    """The sweep was stored but its configs could not be published; it is marked failed."""

    def __init__(self, sweep_id: int, error: Exception):
        self.sweep_id = sweep_id
        super().__init__(f"sweep {sweep_id} was stored but the broker refused its configs: {error}")


@dataclass(frozen=True)
class Started:
    sweep_id: int
    replayed: bool
    configs_total: int
    tasks: int
    source_hash: str | None
    queue: str | None


def ci_label(event: CiEvent) -> str:
    where = f"#{event.pr_number}" if event.pr_number is not None else event.ref.removeprefix("refs/heads/")
    return f"ci {event.repository} {where} {event.commit_sha[:12]}"[:200]


def ci_spec(settings: Settings, event: CiEvent) -> SweepSpec:
    return SweepSpec.model_validate({**settings.ci_spec, "samples": settings.ci_samples, "backend": settings.ci_backend,
                                     "seed": settings.ci_seed, "label": ci_label(event)})


def _replay(session: Session, delivery_id: str) -> Started | None:
    delivery = session.get(CiDelivery, delivery_id)
    if delivery is None:
        return None
    sweep = session.get(Sweep, delivery.sweep_id)
    return Started(sweep.id, True, sweep.configs_total, 0, sweep.source_hash, sweep.queue)


def start_ci_sweep(session: Session, celery: Celery, settings: Settings, event: CiEvent, delivery_id: str) -> Started:
    """The sweep of `event`'s commit (a new one, or the one this delivery started before).

    Raises kernelsrc.git.KernelRepoError when kernels/src cannot be read at the commit (nothing
    stored), BrokerRefused when publishing failed (the sweep is stored, marked failed, and the
    delivery forgotten so that a redelivery starts over)."""
    replay = _replay(session, delivery_id)
    if replay is not None:
        return replay
    source = read_kernels(settings.kernel_repo, event.commit_sha, settings.kernel_repo_cache)
    source_hash = save_bundle(session, source)
    spec = ci_spec(settings, event)
    queue = settings.queue_name(queue_kind(spec.backend))
    memory, device = repo.queue_device_memory(session, queue, settings.worker_stale_s)
    request_extra = {"defects": [], "ci": {"event": event.event, "repository": event.repository, "ref": event.ref,
                                           "commit_sha": event.commit_sha, "delivery": delivery_id}}
    sweep_id, sampled = plan_sweep(session, spec, device_total_memory=memory, device=device, request_extra=request_extra)
    sweep = session.get(Sweep, sweep_id)
    sweep.queue = queue
    sweep.repository, sweep.ref, sweep.commit_sha, sweep.event = event.repository, event.ref, event.commit_sha, event.event
    sweep.base_ref, sweep.pr_number, sweep.source_hash = event.base_ref, event.pr_number, source_hash
    session.add(CiDelivery(delivery_id=delivery_id, event=event.event, sweep_id=sweep_id))
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        replay = _replay(session, delivery_id)
        if replay is None:
            raise
        return replay

    items = [(c.content_hash(), c.to_dict(), c) for c in sampled.configs]
    try:
        tasks = enqueue_configs(celery, settings, sweep_id=sweep_id, backend=spec.backend, configs=items,
                                err_ratio_gate=spec.err_ratio_gate, priority=CI_PRIORITY)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the sweep is marked, the sender told
        log.exception("enqueueing CI sweep %s failed", sweep_id)
        repo.set_status(session, sweep_id, "failed", error=f"enqueueing failed: {exc!r}")
        session.query(CiDelivery).filter(CiDelivery.delivery_id == delivery_id).delete()
        session.commit()
        raise BrokerRefused(sweep_id, exc) from exc
    return Started(sweep_id, False, len(items), tasks, source_hash, queue)
