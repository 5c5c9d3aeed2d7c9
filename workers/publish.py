"""Sending a background task (a sweep's triage, a bisection) to the queue of its backend's workers.

The broker's libraries load only here, when a task is sent: the embedded run triages in-process
and needs none of them. A task the broker does not take stays marked unpublished in the store,
and the reconciler sends it again.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from settings import Settings
from store import bisections, clusters

if TYPE_CHECKING:
    from celery import Celery
    from store.db import Session

log = logging.getLogger(__name__)


def send_background_task(celery: Celery, settings: Settings, task: str, arg: int, backend: str,
                         time_limit: float, label: str) -> bool:
    """Send `task(arg)` to `backend`'s queue with a hard time limit; False when the broker did not take it."""
    from workers.app import queue_kind

    queue = settings.queue_name(queue_kind(backend))
    try:
        celery.send_task(task, args=(arg,), queue=queue, time_limit=time_limit, argsrepr=f"({label})", kwargsrepr="{}")
    except Exception as exc:  # noqa: BLE001 - kombu raises its own and the transport's errors
        log.warning("%s not published (%s); the reconciler publishes it", label, exc)
        return False
    return True


def publish_background(session: Session, celery: Celery, settings: Settings, kind: Literal["triage", "bisection"],
                       row_id: int) -> bool:
    """Publish the task of a sweep's pending triage (`row_id`: the sweep) or of a queued bisection
    to its backend's queue and mark it published (the caller commits). False when there is none
    to publish or the broker did not take it (the reconciler tries again)."""
    from workers.app import TASK_BISECT, TASK_TRIAGE

    task, backend_of, mark_enqueued, time_limit, label = {
        "triage": (TASK_TRIAGE, clusters.triage_backend, clusters.mark_enqueued, settings.triage_time_limit_s, "sweep"),
        "bisection": (TASK_BISECT, bisections.queued_backend, bisections.mark_enqueued, settings.bisect_time_limit_s,
                      "bisection"),
    }[kind]
    backend = backend_of(session, row_id)
    if backend is None or not send_background_task(celery, settings, task, row_id, backend, time_limit,
                                                   f"{label}={row_id}"):
        return False
    mark_enqueued(session, row_id)
    return True
