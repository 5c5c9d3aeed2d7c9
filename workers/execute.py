"""What a Celery worker does with one batch of configs: run each through the executor and store it.

Every config runs through workers.executor.ConfigExecutor, as in the embedded pool; this module
adds what a queue needs: skip configs already recorded (a batch delivered twice) or cancelled,
one transaction per result (a re-run replaces, never duplicates), and moving the sweep
queued -> running -> done.

A config that leaves the device context unusable (a sticky fault) is stored as `fault` and the
process ends right after (FAULT_EXIT); the task is acknowledged late and rejected on worker
loss, so Celery starts a fresh process and delivers the batch again, whose stored configs are
skipped. Each start of a config is counted before it runs (repo.begin_config): a config that
ends every process that runs it without a result (a crash inside a driver, the OOM killer) is
stored as `error` once it has used up MAX_STARTS, not delivered forever.

A sweep that names a source bundle (a CI sweep of some commit) runs on a backend built from
that bundle, read from the store once per worker process; results then carry the bundle's hash,
and their reproducers say to check the commit out first.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any, Callable, Sequence

from attnconfig import parse_config
from settings import Settings
from kernels.source import KernelSource
from store import repo
from store.db import session_scope
from store.kernels import note_kernel, sweep_kernel
from sweeps.policy import gates_for
from sweeps.result import ConfigResult, at_commit, unrun_result
from workers.executor import FAULT_EXIT, WATCHDOG_EXIT, ConfigExecutor, Limits
from workers.triage import sweep_ended

log = logging.getLogger(__name__)

__all__ = ["FAULT_EXIT", "MAX_STARTS", "WATCHDOG_EXIT", "execute_batch"]

# Starts of one config by worker processes that ended without storing it, before it is stored
# as `error` instead of being run again.
MAX_STARTS = 3


class BundleCache:
    """Source bundles read from the store, by hash (content-addressed: never stale)."""

    def __init__(self) -> None:
        self._bundles: dict[str, KernelSource] = {}

    def get(self, url: str, key: str) -> KernelSource | None:
        if key not in self._bundles:
            from store.bundles import load_bundle

            with session_scope(url) as s:
                source = load_bundle(s, key)
            if source is None:
                return None
            self._bundles[key] = source
        return self._bundles[key]


BUNDLES = BundleCache()


def execute_batch(
    settings: Settings,
    sweep_id: int,
    items: Sequence[Sequence[Any]],
    backend_name: str,
    defects: Sequence[str] = (),
    err_ratio_gate: float | None = None,
    worker: str | None = None,
    exit_process: Callable[[int], None] = os._exit,
    celery: Any = None,
) -> dict[str, int]:
    """Run the queued configs among `items` ([config_hash, config dict] pairs) and record each.

    Returns counts of outcomes, plus "skipped" for configs already recorded or cancelled. The
    call that ends the sweep publishes its triage task with `celery` (the task's app; without
    one the reconciler publishes it).
    """
    url = settings.database_url
    defects = frozenset(defects)
    counts: Counter[str] = Counter()
    with session_scope(url) as s:
        status = repo.sweep_status(s, sweep_id)
        pending = repo.pending_hashes(s, sweep_id, [h for h, _ in items]) if status in repo.ACTIVE_STATUSES else set()
        if pending:
            repo.mark_running(s, sweep_id)
        source_hash, commit = repo.sweep_revision(s, sweep_id)
        sanitize = repo.sweep_sanitize(s, sweep_id)
        kernel = sweep_kernel(s, sweep_id)
    if status is None:
        log.warning("sweep %s does not exist; %d configs dropped", sweep_id, len(items))
    source = BUNDLES.get(url, source_hash) if source_hash and pending else None
    executor = ConfigExecutor(backend_name, defects, Limits.of(settings), source,
                              sanitize=sanitize[0] if sanitize else None,
                              sanitize_hashes=sanitize[1] if sanitize else frozenset(), kernel=kernel)
    for i, (config_hash, config_json) in enumerate(items):
        if config_hash not in pending:
            counts["skipped"] += 1
            continue
        with session_scope(url) as s:
            if repo.sweep_status(s, sweep_id) == "cancelled":
                counts["skipped"] += len(items) - i
                break
            starts = repo.begin_config(s, sweep_id, config_hash)
        config = parse_config(config_json)

        def record_and_exit(result: ConfigResult, h: str = config_hash) -> None:
            log.error("sweep %s config %s: stuck past the time limit; recording timeout and restarting", sweep_id, h)
            if commit:
                result.reproducer = at_commit(result.reproducer, commit)
            _record(settings, sweep_id, h, result, worker, celery)
            exit_process(WATCHDOG_EXIT)

        gates = gates_for(config, err_ratio_gate=err_ratio_gate)
        if starts > MAX_STARTS:
            result = unrun_result(config, None, backend_name, gates, "error",
                                  f"{starts - 1} worker processes ended while running this config without "
                                  "storing a result (a crash in a driver, or killed); not run again", kernel=kernel)
        elif source_hash and source is None:
            result = unrun_result(config, None, backend_name, gates, "error",
                                  f"source bundle {source_hash} of this sweep is not in the store", kernel=kernel)
        else:
            result = executor.run(config, gates, record_and_exit)
        if commit:
            result.reproducer = at_commit(result.reproducer, commit)
        _record(settings, sweep_id, config_hash, result, worker, celery)
        counts[result.outcome] += 1
        if result.poisons_process:
            # Nothing may touch this context again: Celery replaces the process and delivers
            # the batch again, whose stored configs are skipped.
            log.error("sweep %s config %s: device fault; ending this worker process", sweep_id, config_hash)
            exit_process(FAULT_EXIT)
            return dict(counts)
    if not pending and status in repo.ACTIVE_STATUSES:
        # A batch delivered again after its worker died between a result and the check below.
        with session_scope(url) as s:
            ended = repo.finish_if_complete(s, sweep_id)
        if ended:
            sweep_ended(settings, sweep_id, celery)
    return dict(counts)


def _record(settings: Settings, sweep_id: int, config_hash: str, result: ConfigResult, worker: str | None,
            celery: Any) -> None:
    url = settings.database_url
    with session_scope(url) as s:
        repo.record_result(s, sweep_id, config_hash, result.to_row(), worker=worker)
        if result.kernel_version:
            note_kernel(s, sweep_id, result.kernel, result.kernel_version)
    # After the commit above, in its own transaction: see repo.finish_if_complete.
    with session_scope(url) as s:
        ended = repo.finish_if_complete(s, sweep_id)
    if ended:
        sweep_ended(settings, sweep_id, celery)
