"""Registered workers: queue, device, memory, versions and last heartbeat."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fastapi import APIRouter

from api.convert import utc
from api.deps import SessionDep, SettingsDep
from api.schemas.workers import WorkerPublic, WorkersPublic
from store.workers import registered_workers

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkersPublic)
def read_workers(session: SessionDep, settings: SettingsDep, queue: str | None = None, alive: bool | None = None) -> WorkersPublic:
    """Every worker that ever registered (stopped and silent ones too, marked alive=false)."""
    fresh = datetime.now(timezone.utc) - timedelta(seconds=settings.worker_stale_s)
    data = []
    for w in registered_workers(session, queue):
        is_alive = w.stopped_at is None and utc(w.last_heartbeat) >= fresh
        public = WorkerPublic(
            **{k: getattr(w, k) for k in WorkerPublic.model_fields if k not in ("alive", "started_at", "last_heartbeat", "stopped_at")},
            started_at=utc(w.started_at), last_heartbeat=utc(w.last_heartbeat), stopped_at=utc(w.stopped_at), alive=is_alive,
        )
        if alive is None or alive == is_alive:
            data.append(public)
    return WorkersPublic(data=data, count=len(data))
