"""The Celery task: a thin wrapper that hands a batch of configs to workers.execute."""
from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from celery.exceptions import TimeLimitExceeded

from workers.app import TASK_RUN_CONFIGS


class ConfigBatchTask(Task):
    """Acknowledged late and rejected on worker loss: results are idempotent, so a batch
    delivered twice is safe (recorded configs are skipped)."""

    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True

    @property
    def settings(self):  # noqa: ANN201
        from core.settings import get_settings

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
    from workers.execute import execute_batch

    return execute_batch(self.settings, sweep_id, items, backend, defects or (), err_ratio_gate,
                         worker=self.request.hostname)
