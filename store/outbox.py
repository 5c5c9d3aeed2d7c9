"""The outbox in the store: which configs of service sweeps are marked "to publish", published,
vanished or still waiting (workers/outbox.py publishes them and reconciles the broker with this).

A config row's `enqueued_at` is the outbox mark: null means "to publish"; `enqueues` counts its
publications. Only sweeps of the service (`queue` set) are touched: an embedded run has no queue.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from store.models import ConfigRun, Sweep
from store.repo import ACTIVE_STATUSES, aware, now


def _live(*where: Any) -> tuple[Any, ...]:
    return (Sweep.status.in_(ACTIVE_STATUSES), Sweep.queue.is_not(None), *where)


_RUNS = ConfigRun.__table__
# Built once: every POST /sweeps runs it, and building the statement cost SQLAlchemy about as
# much CPU as executing it.
_CLAIM = (update(_RUNS)
          .where(_RUNS.c.sweep_id == bindparam("p_sweep_id"), _RUNS.c.state == "queued", _RUNS.c.enqueued_at.is_(None))
          .values(enqueued_at=bindparam("p_now"), enqueues=_RUNS.c.enqueues + 1)
          .returning(_RUNS.c.seq, _RUNS.c.config_hash, _RUNS.c.config))


def claim_pending(session: Session, sweep_id: int) -> list[tuple[str, dict[str, Any]]]:
    """Mark the sweep's configs "to publish" published, in the caller's transaction, and return
    them (hash, config) in sampled order. The update holds their rows until the commit: a second
    publisher (the reconciler beside the submitter) waits, then finds them marked."""
    rows = session.execute(_CLAIM, {"p_sweep_id": sweep_id, "p_now": now()}).all()
    return [(h, c) for _seq, h, c in sorted(rows, key=lambda r: r[0])]


def pending_sweep_ids(session: Session) -> list[int]:
    """Live service sweeps with configs marked "to publish", oldest first."""
    return list(session.scalars(
        select(ConfigRun.sweep_id).join(Sweep, Sweep.id == ConfigRun.sweep_id)
        .where(*_live(ConfigRun.state == "queued", ConfigRun.enqueued_at.is_(None)))
        .group_by(ConfigRun.sweep_id).order_by(ConfigRun.sweep_id)))


def live_sweep(session: Session, sweep_id: int) -> Sweep | None:
    """The sweep while it is queued or running, else None."""
    sweep = session.get(Sweep, sweep_id)
    return sweep if sweep is not None and sweep.status in ACTIVE_STATUSES else None


def published_before(session: Session, cutoff: datetime) -> list[tuple[int, str, int]]:
    """(sweep_id, config_hash, enqueues) of the queued configs of live service sweeps published
    before `cutoff`: those whose task may have vanished."""
    return [tuple(r) for r in session.execute(
        select(ConfigRun.sweep_id, ConfigRun.config_hash, ConfigRun.enqueues)
        .join(Sweep, Sweep.id == ConfigRun.sweep_id)
        .where(*_live(ConfigRun.state == "queued", ConfigRun.enqueued_at.is_not(None),
                      ConfigRun.enqueued_at < cutoff))).all()]


def mark_to_publish(session: Session, keys: Iterable[tuple[int, str]]) -> None:
    """Mark these (sweep_id, config_hash) "to publish" again, where they are still queued."""
    for sid, h in keys:
        session.execute(update(ConfigRun).where(ConfigRun.sweep_id == sid, ConfigRun.config_hash == h,
                                                ConfigRun.state == "queued").values(enqueued_at=None))


def complete_sweep_ids(session: Session) -> list[int]:
    """Live service sweeps none of whose configs is still queued."""
    still = select(ConfigRun.id).where(ConfigRun.sweep_id == Sweep.id, ConfigRun.state == "queued").exists()
    return list(session.scalars(select(Sweep.id).where(*_live(~still))))


def queued_live_count(session: Session) -> int:
    """Configs waiting for a worker in sweeps that are still queued or running."""
    return session.scalar(select(func.count()).select_from(ConfigRun).join(Sweep, Sweep.id == ConfigRun.sweep_id)
                          .where(ConfigRun.state == "queued", Sweep.status.in_(ACTIVE_STATUSES))) or 0


def unpublished_count(session: Session) -> int:
    """Configs of live service sweeps committed but not yet on the broker."""
    return session.scalar(select(func.count()).select_from(ConfigRun).join(Sweep, Sweep.id == ConfigRun.sweep_id)
                          .where(*_live(ConfigRun.state == "queued", ConfigRun.enqueued_at.is_(None)))) or 0


def stuck_sweeps(session: Session, after_s: float) -> list[int]:
    """Queued or running service sweeps with nothing in flight: complete but not ended, configs
    waiting to be published for `after_s`, or nothing stored or published for `after_s`."""
    cutoff = now() - timedelta(seconds=after_s)
    stats = session.execute(
        select(Sweep.id, Sweep.created_at,
               func.count(ConfigRun.id).filter(ConfigRun.state == "queued"),
               func.max(ConfigRun.finished_at), func.max(ConfigRun.enqueued_at),
               func.count(ConfigRun.id).filter(ConfigRun.state == "queued", ConfigRun.enqueued_at.is_(None)))
        .join(ConfigRun, ConfigRun.sweep_id == Sweep.id, isouter=True)
        .where(*_live())
        .group_by(Sweep.id, Sweep.created_at)).all()
    out = []
    for sid, created, queued, last_result, last_publish, unpublished in stats:
        moments = [aware(t) for t in (created, last_result, last_publish) if t is not None]
        idle = max(moments) < cutoff if moments else True
        if queued == 0 or idle or (unpublished and aware(created) < cutoff):
            out.append(sid)
    return out


def stalled_seconds(session: Session) -> float:
    """Seconds since anything moved for the configs waiting in queued or running service sweeps:
    since the last result stored in such a sweep, or since the newest of them was created; 0
    when no config waits. A broker that lost its tasks (flushed, restarted empty) shows here
    until the reconciler requeues them."""
    rows = session.execute(
        select(Sweep.created_at, func.max(ConfigRun.finished_at))
        .join(ConfigRun, ConfigRun.sweep_id == Sweep.id)
        .where(*_live())
        .group_by(Sweep.id, Sweep.created_at)
        .having(func.count(ConfigRun.id).filter(ConfigRun.state == "queued") > 0)).all()
    moments = [aware(t) for row in rows for t in row if t is not None]
    if not moments:
        return 0.0
    return max(0.0, (now() - max(moments)).total_seconds())
