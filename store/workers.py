"""The worker registry's reads (the writes, registering and heartbeats, are store.repo's)."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import Worker


def registered_workers(session: Session, queue: str | None = None) -> list[Worker]:
    """Every worker that ever registered (on `queue` when given), by queue and name."""
    query = select(Worker).order_by(Worker.queue, Worker.name)
    if queue is not None:
        query = query.where(Worker.queue == queue)
    return list(session.scalars(query))
