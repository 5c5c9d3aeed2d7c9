"""Accepting a sweep: resolve the budget, sample and prefilter, commit, then publish (workers.outbox).

Planning is sweeps.plan.plan_sweep, as in the embedded mode (its configs go in with one COPY
on PostgreSQL: a 10,000-config sweep is stored and queued in about a second). The sweep, all
its configs and their outbox marks are committed together (nothing half-written); only then
are the configs published, so a worker never receives a config the database does not hold. If
the broker refuses or does not answer, the sweep is still accepted (202, `published: false`) and
the reconciler publishes it once the broker is back.

Idempotency-Key: a client that retries a POST /sweeps (a timeout, a dropped connection) sends
the same key and gets the sweep its first request made instead of a second one. The key is
stored with the sweep (unique) beside the sha256 of the request body; the same key with a
different body is a 422 on the key.
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from celery import Celery
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.errors import ProblemError
from api.schemas.sweeps import SweepAccepted, SweepCreate
from attnconfig import AttentionConfig
from settings import Settings
from store import repo
from store.models import ConfigRun, Sweep
from sweeps.plan import plan_sweep
from sweeps.sampler import SamplingExhausted
from sweeps.spec import SweepSpec
from workers.app import queue_kind
from workers.outbox import submit

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_IDEMPOTENCY_KEY = 200  # sweeps.idempotency_key is VARCHAR(200)


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


def check_idempotency_key(key: str | None) -> str | None:
    """The key, or a 422 naming the header: 1 to 200 printable ASCII characters."""
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not all(" " <= ch <= "~" for ch in key):
        raise ProblemError([(IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_IDEMPOTENCY_KEY} printable "
                                                 "ASCII characters (a UUID, say)")])
    return key


def request_sha256(body: SweepCreate, extra: dict[str, Any] | None) -> str:
    canon = json.dumps({"body": body.model_dump(mode="json"), "extra": extra or {}}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _earlier(session: Session, key: str, digest: str) -> Sweep | None:
    sweep = session.scalar(select(Sweep).where(Sweep.idempotency_key == key))
    if sweep is not None and sweep.request_sha256 != digest:
        raise ProblemError([(IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} {key!r} was used by sweep {sweep.id} with another "
                                                 "request; use a new key for a new request")])
    return sweep


def _accepted(session: Session, sweep: Sweep, tasks: int, published: bool, replayed: bool,
              draws: int, filtered: dict[str, int]) -> SweepAccepted:
    return SweepAccepted(
        id=sweep.id, status=sweep.status, queue=sweep.queue, configs_total=sweep.configs_total, tasks=tasks, seed=sweep.seed,
        draws=draws, filtered=filtered, splitkv_budget=sweep.splitkv_budget, budget_source=sweep.budget_source,
        published=published, replayed=replayed,
    )


def _replayed(session: Session, sweep: Sweep) -> SweepAccepted:
    waiting = session.scalar(select(func.count()).select_from(ConfigRun).where(
        ConfigRun.sweep_id == sweep.id, ConfigRun.state == "queued", ConfigRun.enqueued_at.is_(None))) or 0
    return _accepted(session, sweep, 0, waiting == 0, True, sweep.draws, repo.sweep_counts(session, sweep.id)["filtered"])


def submit_sweep(session: Session, celery: Celery, settings: Settings, body: SweepCreate, *,
                 configs: list[AttentionConfig] | None = None, rerun_of: int | None = None,
                 extra_request: dict[str, Any] | None = None, idempotency_key: str | None = None) -> SweepAccepted:
    key = check_idempotency_key(idempotency_key)
    digest = request_sha256(body, {**(extra_request or {}), "rerun_of": rerun_of}) if key else None
    if key:
        earlier = _earlier(session, key, digest)
        if earlier is not None:
            return _replayed(session, earlier)
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
    planned: dict[str, Any] = {}

    def store(s: Session) -> int:
        try:
            sweep_id, sampled = plan_sweep(s, spec, device_total_memory=memory, device=device,
                                           configs=configs, request_extra=request_extra,
                                           sanitize=(body.sanitize, body.sanitize_share) if body.sanitize else None,
                                           defects=tuple(sorted(body.defects)))
        except SamplingExhausted as exc:
            raise ProblemError([("max_draws", str(exc))]) from None
        planned["filtered"], planned["draws"] = (sampled.filtered, sampled.draws) if sampled is not None else ({}, 0)
        sweep = s.get(Sweep, sweep_id)
        sweep.queue, sweep.rerun_of = queue, rerun_of
        sweep.idempotency_key, sweep.request_sha256 = key, digest
        return sweep_id

    try:
        done = submit(session, celery, settings, store)
    except IntegrityError:
        # Two requests with one key raced: the first one's commit won; answer with its sweep.
        session.rollback()
        earlier = _earlier(session, key, digest) if key else None
        if earlier is None:
            raise
        return _replayed(session, earlier)
    sweep = session.get(Sweep, done.sweep_id)
    return _accepted(session, sweep, done.tasks, done.published, False, planned["draws"], planned["filtered"])
