"""A finished sweep's triage (triage/): computed by a worker, never by the API process.

- Service: the transaction that ends a sweep writes its triage `pending` (repo.finish_if_complete);
  whoever ended it then publishes one triage task to the sweep's own queue (`sweep_ended`), so a
  GPU sweep's failures are shrunk and classified on a GPU worker, as they ran. A triage task the
  broker did not take is published by the reconciler (workers.outbox), as configs are.
- Embedded (`attnsweep run`): submit.sweep.run_sweep calls `run_triage` in its own process after
  the sweep, with the run's unit of work.

`run_triage` claims the sweep's triage (store.clusters.claim_triage: a second delivery of the
task, or a second call, finds it done and computes nothing), runs triage.sweep.triage_sweep
within the settings' bounds (the largest TRIAGE_CLUSTERS clusters shrunk, each shrink bounded
in runs and seconds, each run in seconds) and stores the clusters, replacing any earlier ones.
An error of the triage itself is stored as its `failed` reason: a triage never fails the sweep.
An interruption is no verdict: a triage whose worker is shut down (SIGTERM, SystemExit) or
whose database goes away goes back to `pending` and runs again, like any task.

A CI push sweep's bisections (workers/bisect.py: one per cluster with new failures) are planned
here and stored in the transaction that stores the triage, done or failed, so the decision is
made once per triage; their tasks are published after that commit (or by the reconciler).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence


from settings import Settings, get_settings
from store import clusters as stored
from store.db import Session, is_unreachable, session_scope
from store.models import Sweep
from workers.publish import publish_background

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)


def triage_bounds(settings: Settings) -> dict[str, Any]:
    """triage_sweep's limits from the settings."""
    return {"max_runs": settings.triage_shrink_runs, "max_seconds": settings.triage_shrink_seconds,
            "time_limit_s": settings.triage_run_time_limit_s or None, "max_clusters": settings.triage_clusters}


def run_triage(session: Session, sweep_id: int, settings: Settings | None = None, *, backend: str | None = None,
               force: bool = False, bounds: dict[str, Any] | None = None, celery: Celery | None = None) -> str:
    """Compute and store the sweep's clusters unless another call did (or does); returns the
    triage's status afterwards (done, failed; running when another holds it; none when there
    is no such sweep). `session`: the caller's unit of work (store.db.unit_of_work), committed
    here where each step's transaction ends. `bounds` replace the settings' (triage_bounds'
    keys). With `celery`, the CI bisections it stores are published here."""
    from triage.sweep import triage_sweep
    from workers.bisect import ci_bisection_plans, store_plans

    settings = settings or get_settings()
    if session.get(Sweep, sweep_id) is None:
        session.commit()
        return "none"
    if not stored.claim_triage(session, sweep_id, stale_after_s=settings.triage_time_limit_s, force=force):
        status = stored.triage_status(session, sweep_id)
        session.commit()
        return status
    session.commit()
    try:
        found = [c.to_dict() for c in triage_sweep(session, sweep_id, backend, settings=settings,
                                                   **{**triage_bounds(settings), **(bounds or {})})]
        session.commit()
        plans = ci_bisection_plans(session, sweep_id, settings, found)
        stored.store_clusters(session, sweep_id, found)
        store_plans(session, plans)
        session.commit()
    except BaseException as exc:
        session.rollback()
        if not isinstance(exc, Exception) or is_unreachable(exc):
            log.warning("triage of sweep %s interrupted (%s: %s); it runs again", sweep_id, type(exc).__name__, exc)
            release(session, sweep_id)
            raise
        log.exception("triage of sweep %s failed", sweep_id)
        # The new failures are bisected all the same, from the sweep's results alone.
        record_failure(session, sweep_id, f"{type(exc).__name__}: {exc}",
                       ci_bisection_plans(session, sweep_id, settings, None))
        outcome = "failed"
    else:
        outcome = "done"
    if celery is not None:
        publish_sweep_bisections(session, celery, settings, sweep_id)
    # A CI sweep's commit status again, now counting bugs (ci.verdict.failures_text) and saying
    # whether their first bad commits are being looked for.
    from ci.notify import sweep_ended as post_final_status

    post_final_status(sweep_id, session=session)
    return outcome


def release(session: Session, sweep_id: int) -> None:
    """The triage back to `pending` for another try (store.clusters.release_triage); with the
    database away it stays `running` and is taken again once stale."""
    try:
        stored.release_triage(session, sweep_id)
        session.commit()
    except Exception:  # noqa: BLE001 - claim_triage takes a stale running row again
        session.rollback()
        log.exception("triage of sweep %s: not released for another try", sweep_id)


def record_failure(session: Session, sweep_id: int, reason: str, bisections: Sequence[dict[str, Any]] = ()) -> None:
    """Store the triage failed with `reason` (and the CI bisections planned without it); a
    database that is away too is logged, not raised."""
    from workers.bisect import store_plans

    try:
        stored.fail_triage(session, sweep_id, reason)
        store_plans(session, bisections)
        session.commit()
    except Exception:  # noqa: BLE001 - the row stays running and is taken again once stale
        session.rollback()
        log.exception("triage of sweep %s: its failure was not stored", sweep_id)


def publish_sweep_bisections(session: Session, celery: Celery, settings: Settings, sweep_id: int) -> None:
    """Publish the tasks of the sweep's CI bisections that are queued and unpublished; the
    reconciler publishes those the broker does not take now."""
    from workers.bisect import queued_for_sweep

    try:
        for bisection_id in queued_for_sweep(session, sweep_id):
            publish_background(session, celery, settings, "bisection", bisection_id)
        session.commit()
    except Exception:  # noqa: BLE001 - the reconciler publishes it
        session.rollback()
        log.exception("sweep %s: its CI bisection was not published", sweep_id)


def publish_pending(session: Session, celery: Celery, settings: Settings) -> int:
    """Publish every pending triage not published yet; returns how many were."""
    done = sum(publish_background(session, celery, settings, "triage", sid) for sid in stored.unpublished(session))
    session.commit()
    return done


def sweep_ended(settings: Settings, sweep_id: int, celery: Celery | None) -> None:
    """Called by whoever moved a service sweep to done, after that commit: the commit status
    (ci.notify) and the triage task. Without a Celery app at hand the reconciler publishes it."""
    from ci.notify import sweep_ended as post_final_status

    post_final_status(sweep_id, settings.database_url)
    if celery is None:
        return
    try:
        with session_scope(settings.database_url) as s:
            publish_background(s, celery, settings, "triage", sweep_id)
    except Exception:  # noqa: BLE001 - the sweep is done either way; the reconciler publishes it
        log.exception("triage of sweep %s not published", sweep_id)
