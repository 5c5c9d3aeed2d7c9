"""The Celery task: a thin wrapper that hands a batch of configs to workers.execute.

A batch that cannot reach the database is retried with backoff, never acknowledged as done:
the task is published again (same arguments, queue and priority) with a countdown of 2, 4, 8 ...
seconds, at most DB_RETRY_MAX_S, for as long as the database stays away. Results are idempotent
(configs already recorded are skipped), so the retry runs only what is still queued.
"""
from __future__ import annotations

import logging
import random
from typing import Any

from celery import Task, shared_task
from celery.exceptions import TimeLimitExceeded

from workers.app import TASK_RUN_CONFIGS

log = logging.getLogger(__name__)

DB_RETRY_MAX_S = 30.0  # longest wait between two tries of a batch while the database is away


def db_retry_countdown(retries: int) -> float:
    """2, 4, 8, 16, then DB_RETRY_MAX_S seconds; +-20 % jitter so workers do not retry in step."""
    base = min(DB_RETRY_MAX_S, 2.0 ** (retries + 1))
    return base * random.uniform(0.8, 1.2)


class ConfigBatchTask(Task):
    """Acknowledged late and rejected on worker loss: results are idempotent, so a batch
    delivered twice is safe (recorded configs are skipped)."""

    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    # A batch waits out a database outage however long it lasts (Celery's default gives up after
    # 3 retries, about 15 s here, and acknowledges the task as failed).
    max_retries = None

    @property
    def settings(self):  # noqa: ANN201
        from settings import get_settings

        return getattr(self.app, "attnsweep_settings", None) or get_settings()

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Celery's own hard limit (the last resort behind the per-config watchdog) killed the
        batch: record `timeout` for its configs still queued, so the sweep can finish."""
        if not isinstance(exc, TimeLimitExceeded):
            return
        from workers.registry import record_unfinished

        sweep_id, items = list(args)[:2] if len(args) >= 2 else (kwargs["sweep_id"], kwargs["items"])
        record_unfinished(self.settings, sweep_id, items, f"the task's hard time limit killed it: {exc}")


@shared_task(name=TASK_RUN_CONFIGS, bind=True, base=ConfigBatchTask)
def run_configs(self: ConfigBatchTask, sweep_id: int, items: list, backend: str, defects: list | None = None,
                err_ratio_gate: float | None = None) -> dict[str, int]:
    """Run one batch, [[config_hash, config], ...] of sweep `sweep_id`, on `backend`."""
    from store.db import is_unreachable
    from workers.execute import execute_batch

    try:
        return execute_batch(self.settings, sweep_id, items, backend, defects or (), err_ratio_gate,
                             worker=self.request.hostname)
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        countdown = db_retry_countdown(self.request.retries)
        log.warning("sweep %s: the database cannot be reached (%s); batch of %d configs retried in %.0f s (try %d)",
                    sweep_id, type(exc).__name__, len(items), countdown, self.request.retries + 1)
        raise self.retry(exc=exc, countdown=countdown) from None
