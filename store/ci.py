"""The CI reads and writes: a commit's sweeps, the sweeps its failures are compared with, the
failing configs of a sweep, the deliveries of webhook events and the CI columns of a sweep."""
from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from attnconfig.outcomes import FAILING_OUTCOMES
from store.models import CiDelivery, ConfigRun, Sweep


def sweep_for_commit(session: Session, commit_sha: str, repository: str | None = None,
                     event: str | None = None) -> Sweep | None:
    """The newest CI sweep of a commit (a push and a pull request may both have swept it)."""
    q = select(Sweep).where(Sweep.commit_sha == commit_sha, Sweep.event.is_not(None))
    if repository is not None:
        q = q.where(Sweep.repository == repository)
    if event is not None:
        q = q.where(Sweep.event == event)
    return session.scalars(q.order_by(Sweep.id.desc()).limit(1)).first()


def _latest_push_sweep(session: Session, sweep: Sweep, *where: Any) -> Sweep | None:
    q = (select(Sweep)
         .where(Sweep.repository == sweep.repository, Sweep.status == "done", Sweep.event == "push", Sweep.id != sweep.id,
                *where)
         .order_by(Sweep.finished_at.desc(), Sweep.id.desc()).limit(1))
    return session.scalars(q).first()


def base_sweep(session: Session, sweep: Sweep) -> Sweep | None:
    """The latest finished push sweep of a pull request's base branch in the same repository."""
    if sweep.event != "pull_request" or not sweep.base_ref:
        return None
    return _latest_push_sweep(session, sweep, Sweep.ref == sweep.base_ref)


def before_sweep(session: Session, sweep: Sweep) -> Sweep | None:
    """The latest finished push sweep of a push's `before` commit in the same repository: what
    its failures are new against (workers/bisect.py)."""
    before = ((sweep.request or {}).get("ci") or {}).get("before")
    if sweep.event != "push" or not before:
        return None
    return _latest_push_sweep(session, sweep, Sweep.commit_sha == before)


def _failing(sweep_id: int) -> tuple[Any, ...]:
    return (ConfigRun.sweep_id == sweep_id, ConfigRun.state == "done", ConfigRun.outcome.in_(FAILING_OUTCOMES))


def failing_runs(session: Session, sweep_id: int) -> list[ConfigRun]:
    """The sweep's failing configs, in sampled order."""
    return list(session.scalars(select(ConfigRun).where(*_failing(sweep_id)).order_by(ConfigRun.seq)))


def failing_hashes(session: Session, sweep_id: int) -> set[str]:
    return set(session.scalars(select(ConfigRun.config_hash).where(*_failing(sweep_id))))


def ci_sweeps(session: Session, repository: str | None, limit: int, offset: int) -> list[Sweep]:
    """CI sweeps, newest first."""
    q = select(Sweep).where(Sweep.event.is_not(None))
    if repository is not None:
        q = q.where(Sweep.repository == repository)
    return list(session.scalars(q.order_by(Sweep.id.desc()).offset(offset).limit(limit)))


def ci_repositories(session: Session) -> list[tuple[str, int, Sweep]]:
    """(repository, CI sweeps, newest CI sweep) of every repository that sent an event, by name."""
    rows = session.execute(select(Sweep.repository, func.count(), func.max(Sweep.id))
                           .where(Sweep.event.is_not(None), Sweep.repository.is_not(None))
                           .group_by(Sweep.repository).order_by(Sweep.repository)).all()
    return [(repo_name, n, session.get(Sweep, newest)) for repo_name, n, newest in rows]


def delivered_sweep(session: Session, delivery_id: str, body_sha256: str | None = None) -> Sweep | None:
    """The sweep a webhook delivery started: by its delivery id, else by the sha256 of its signed
    body (the same event delivered again under a new id); None for a new event."""
    delivery = session.get(CiDelivery, delivery_id)
    if delivery is None and body_sha256 is not None:
        delivery = session.scalar(select(CiDelivery).where(CiDelivery.body_sha256 == body_sha256))
    return session.get(Sweep, delivery.sweep_id) if delivery is not None else None


def store_ci_event(session: Session, sweep: Sweep, *, delivery_id: str, body_sha256: str | None, event: str,
                   repository: str, ref: str, commit_sha: str, base_ref: str | None, pr_number: int | None,
                   source_hash: str | None) -> None:
    """The CI columns of a sweep a webhook event started, and the delivery, in the caller's
    transaction (a second delivery of the event hits the delivery's unique keys)."""
    sweep.repository, sweep.ref, sweep.commit_sha, sweep.event = repository, ref, commit_sha, event
    sweep.base_ref, sweep.pr_number, sweep.source_hash = base_ref, pr_number, source_hash
    session.add(CiDelivery(delivery_id=delivery_id, event=event, sweep_id=sweep.id, body_sha256=body_sha256))
