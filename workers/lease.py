"""The lease on a worker's tasks: renewed while the worker lives, expired when it dies.

kombu's Redis transport keeps every delivered, unacknowledged task in a hash with its delivery
time in a sorted set (`unacked_index`); a consumer puts back on its queue every task delivered
more than `visibility_timeout` seconds ago. A thread of the worker's main process (the one that
holds the deliveries; pool children only run them) sets that time to now, every
`lease_renew_s`, for every task the worker has reserved, holds for a countdown, or is running.
So a task stays with its worker however long it runs, and when the worker's main process dies
the renewals stop and its tasks go back on the queue `visibility_timeout` seconds later.
"""
from __future__ import annotations

import logging
import time

from settings import Settings
from workers.app import redis_client
from workers.periodic import PeriodicThread

log = logging.getLogger(__name__)

UNACKED_INDEX_KEY = "unacked_index"  # kombu's default (no global_keyprefix is set)


def held_delivery_tags() -> set[str]:
    """Delivery tags of every task this worker process holds (reserved, scheduled or active)."""
    from celery.worker import state

    for _ in range(5):  # the consumer thread changes these sets while they are read
        try:
            requests = list(state.requests.values()) + list(state.active_requests)
            break
        except RuntimeError:
            continue
    else:
        return set()
    tags = set()
    for req in requests:
        message = getattr(req, "message", None)
        tag = getattr(message, "delivery_tag", None)
        if tag:
            tags.add(str(tag))
    return tags


def renew(settings: Settings, tags: set[str]) -> int:
    """Set the delivery time of these held tasks to now; returns how many were renewed."""
    if not tags:
        return 0
    client = redis_client(settings)
    if client is None:
        return 0
    try:
        now = time.time()
        # XX: only tasks still in the index (an acknowledged task is not put back).
        return int(client.zadd(UNACKED_INDEX_KEY, {tag: now for tag in tags}, xx=True, ch=True) or 0)
    finally:
        client.close()


class LeaseRenewer(PeriodicThread):
    """Renews the leases of the tasks this worker holds every `lease_renew_s`; with the broker
    away, tries again after a second."""

    def __init__(self, settings: Settings):
        super().__init__("attnsweep-lease", settings.lease_renew_s, lambda: renew(settings, held_delivery_tags()),
                         what="renewing task leases", retry_s=1.0)
