"""The Celery app: the broker, the two queues and the settings long GPU tasks need.

Celery's guide for long tasks: acknowledge late (a task lost with its worker is delivered
again; our result writes are idempotent, so running twice is safe), reject on worker loss,
prefetch one task at a time. Redis's visibility timeout is a lease (ATTNSWEEP_VISIBILITY_TIMEOUT_S,
two minutes) that each live worker renews for the tasks it holds (workers.lease), so it need not
outlast the longest task: a running task is never handed to a second worker while its worker
lives, and a dead worker's tasks run again within minutes.

CI sweeps go before all others: every task carries a message priority, and kombu's Redis
transport keeps one list per priority step and pops them in step order, lowest first (on Redis
0 is the highest priority, the reverse of AMQP). CI tasks are sent with CI_PRIORITY, every
other sweep's with SWEEP_PRIORITY, so a worker that asks for its next task takes a queued CI
task before any queued nightly one. Tasks a worker has already reserved (at most its
concurrency, with a prefetch multiplier of 1) still run first.

`celery -A workers.app ...` (Flower, inspect) finds `app` here; it is built from the settings
when first asked for, never at import time.
"""
from __future__ import annotations

from typing import Any

from celery import Celery

from settings import Settings, get_settings

TASK_RUN_CONFIGS = "attnsweep.run_configs"
TASK_TRIAGE = "attnsweep.triage_sweep"
TASK_BISECT = "attnsweep.bisect"
PRIORITY_STEPS = [0, 3, 6, 9]
CI_PRIORITY = 0      # Redis: the lowest step is popped first
SWEEP_PRIORITY = 6   # nightly and other API sweeps


def queue_kind(backend: str) -> str:
    """docs/spec.md §8: backend cpu -> the cpu queue; auto, cuda, hip -> the GPU queue. hostemu runs on
    the CPU too, so it goes to the cpu queue."""
    return "cpu" if backend in ("cpu", "hostemu") else "gpu"


def transport_options(settings: Settings) -> dict[str, Any]:
    """kombu's Redis transport: the lease on a delivered task, the priority lists, and the socket
    timeouts that keep a frozen or vanished Redis from hanging a client (connect, every command)."""
    return {
        "visibility_timeout": settings.visibility_timeout_s,
        "priority_steps": PRIORITY_STEPS,
        # Every 10 s a consumer puts back the deliveries whose lease expired (kombu's default
        # scans every 100 s).
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
        "socket_connect_timeout": settings.broker_connect_timeout_s,
        "socket_timeout": settings.broker_socket_timeout_s,
        "socket_keepalive": True,
        "retry_on_timeout": False,
        "health_check_interval": 10,
    }


def redis_client(settings: Settings, timeout: float | None = None) -> Any:
    """A redis-py client of the broker (None for a broker that is not Redis, as memory:// in
    tests), with connect and command timeouts: `timeout`, else the broker settings'."""
    url = settings.broker_url
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=timeout or settings.broker_connect_timeout_s,
                                socket_timeout=timeout or settings.broker_socket_timeout_s, retry_on_timeout=False)


def create_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery = Celery("attnsweep", broker=settings.broker_url, include=["workers.tasks"])
    celery.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # results go to the database, never to a result backend
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.queue_name("cpu"),
        task_time_limit=settings.task_time_limit_s,
        broker_transport_options=transport_options(settings),
        # Publishing (POST /sweeps, the webhook, the reconciler) gives up after one quick retry
        # instead of kombu's default of retrying for about a minute: a refused publish is left to
        # the reconciler (workers.outbox), never to a caller that waits.
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0},
        broker_connection_timeout=settings.broker_connect_timeout_s,
        task_default_priority=SWEEP_PRIORITY,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=True,  # Flower
        worker_hijack_root_logger=False,
    )
    celery.attnsweep_settings = settings  # read by the task (workers.tasks) in the worker
    return celery


def __getattr__(name: str) -> Any:
    if name == "app":
        global app
        app = create_celery()
        return app
    raise AttributeError(name)
