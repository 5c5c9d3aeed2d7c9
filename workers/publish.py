"""Sending a background task (a sweep's triage, a bisection) to the queue of its backend's workers.

The broker's libraries load only here, when a task is sent: the embedded run triages in-process
and needs none of them. A task the broker does not take stays marked unpublished in the store,
and the reconciler sends it again.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from settings import Settings

if TYPE_CHECKING:
    from celery import Celery

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
