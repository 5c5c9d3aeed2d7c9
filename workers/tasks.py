"""The Celery tasks: thin wrappers that hand a batch of configs to workers.execute, a
finished sweep to workers.triage and a bisection to workers.bisect.

A batch that cannot reach the database is retried with backoff, never acknowledged as done:
the task is published again (same arguments, queue and priority) with a countdown of 2, 4, 8 ...
seconds, at most DB_RETRY_MAX_S, for as long as the database stays away. Results are idempotent
(configs already recorded are skipped), so the retry runs only what is still queued. A batch
whose writes the database refused past workers.execute's own retries names the configs whose
kernel came back (`returned`), so that running them again is not counted as a process death.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Callable

from celery import Task, shared_task
from celery.exceptions import TimeLimitExceeded

from workers.app import TASK_BISECT, TASK_RUN_CONFIGS, TASK_TRIAGE

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
        record_unfinished(self.settings, sweep_id, items, f"the task's hard time limit killed it: {exc}", celery=self.app)


@shared_task(name=TASK_RUN_CONFIGS, bind=True, base=ConfigBatchTask)
def run_configs(self: ConfigBatchTask, sweep_id: int, items: list, backend: str, defects: list | None = None,
                err_ratio_gate: float | None = None, returned: list | None = None) -> dict[str, int]:
    """Run one batch, [[config_hash, config], ...] of sweep `sweep_id`, on `backend`."""
    from store.db import is_unreachable
    from workers.execute import ResultsNotStored, execute_batch

    try:
        return execute_batch(self.settings, sweep_id, items, backend, defects or (), err_ratio_gate,
                             worker=self.request.hostname, celery=self.app, returned=returned or ())
    except Exception as exc:
        if not (is_unreachable(exc) or isinstance(exc, ResultsNotStored)):
            raise
        kwargs = dict(self.request.kwargs or {})
        if isinstance(exc, ResultsNotStored) and exc.returned:
            kwargs["returned"] = sorted(set(returned or ()) | set(exc.returned))
        countdown = db_retry_countdown(self.request.retries)
        log.warning("sweep %s: the database cannot be reached (%s); batch of %d configs retried in %.0f s (try %d)",
                    sweep_id, type(exc).__name__, len(items), countdown, self.request.retries + 1)
        raise self.retry(exc=exc, countdown=countdown, kwargs=kwargs) from None


def _retry_when_unreachable(task: Task, what: str, run: Callable[[], str]) -> str:
    """run(), retried later when the database cannot be reached: the work is stored nowhere yet."""
    from store.db import is_unreachable

    try:
        return run()
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        countdown = db_retry_countdown(task.request.retries)
        log.warning("%s: the database cannot be reached (%s); retried in %.0f s", what, type(exc).__name__, countdown)
        raise task.retry(exc=exc, countdown=countdown) from None


class TriageTask(ConfigBatchTask):
    """Acknowledged late like a batch: a triage delivered again after its worker died claims the
    sweep's triage once the first claim is stale (store.clusters.claim_triage), and one already
    done computes nothing. Its hard time limit (settings.triage_time_limit_s, sent with the task)
    stores the triage failed, never the sweep."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        from store.db import unit_of_work
        from workers.triage import record_failure

        sweep_id = list(args)[0] if args else kwargs["sweep_id"]
        with unit_of_work(self.settings.database_url) as session:
            record_failure(session, sweep_id, f"{type(exc).__name__}: {exc}")


@shared_task(name=TASK_TRIAGE, bind=True, base=TriageTask)
def triage_sweep(self: TriageTask, sweep_id: int) -> str:
    """Cluster, shrink and classify the failures of finished sweep `sweep_id`; store the clusters."""
    from store.db import unit_of_work
    from workers.triage import run_triage

    def triage() -> str:
        with unit_of_work(self.settings.database_url) as session:
            return run_triage(session, sweep_id, self.settings, celery=self.app)

    return _retry_when_unreachable(self, f"triage of sweep {sweep_id}", triage)


class BisectTask(ConfigBatchTask):
    """Acknowledged late like a batch: a bisection delivered again finds it running (and does
    nothing) or, once its dead worker's heartbeat is stale, queued again by the reconciler
    (workers.bisect). Its hard time limit (settings.bisect_time_limit_s, sent with the task)
    stores the bisection `error`."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        from workers.bisect import record_failure

        bisection_id = list(args)[0] if args else kwargs["bisection_id"]
        record_failure(self.settings.database_url, bisection_id, f"{type(exc).__name__}: {exc}")


@shared_task(name=TASK_BISECT, bind=True, base=BisectTask)
def bisect_commits(self: BisectTask, bisection_id: int) -> str:
    """Find the first bad commit of stored bisection `bisection_id`; store it."""
    from workers.bisect import run_bisection

    return _retry_when_unreachable(self, f"bisection {bisection_id}",
                                   lambda: run_bisection(self.settings.database_url, bisection_id, self.settings))
