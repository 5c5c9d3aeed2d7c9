"""Ask for a bisection (POST /bisect): store it queued, commit, then publish its task.

The row is committed before anything is published, as a sweep is (workers/outbox.py): if the
broker does not take the task now, the bisection stays queued and unpublished and the reconciler
publishes it. The bisection itself runs on a worker (workers/bisect.py), never here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from celery import Celery

from settings import Settings
from store.db import Session
from store import bisections as stored
from workers.app import queue_kind
from workers.publish import publish_background


@dataclass(frozen=True)
class BisectionAccepted:
    id: int
    status: str
    queue: str
    published: bool


def submit_bisection(session: Session, celery: Celery, settings: Settings, *, repo: str, good: str, bad: str,
                     configs: Sequence[dict[str, Any]], backend: str = "cpu", defects: Sequence[str] = (),
                     err_ratio_gate: float | None = None, submitted_by: str | None = None) -> BisectionAccepted:
    """Store a queued bisection of `good`..`bad` of `repo` over `configs` (validated by the
    caller, `repo` one the deployment trusts) and publish its task; a broker that refuses is left
    to the reconciler. `submitted_by` names who asked (an API token's name)."""
    row = stored.create_bisection(session, repo=repo, good=good, bad=bad, backend=backend, configs=list(configs),
                                  defects=list(defects), err_ratio_gate=err_ratio_gate, submitted_by=submitted_by)
    bisection_id = row.id
    session.commit()
    published = publish_background(session, celery, settings, "bisection", bisection_id)
    session.commit()
    return BisectionAccepted(bisection_id, "queued", settings.queue_name(queue_kind(backend)), published)
