"""What a Celery worker does with one batch of configs: run each through the executor and store it.

Every config runs through isolation.executor.ConfigExecutor, as in the embedded pool; this module
adds what a queue needs: skip configs already stored (a batch delivered twice, or taken over by
another worker while this one was stopped) or cancelled, one transaction per result, and moving
the sweep queued -> running -> done. A stored result is final (repo.record_results: first write
wins); a late one is discarded and logged.

A config's outcome comes only from running it. A write that the database refuses (it is down,
restarting, or its disk is full) is retried in this process with backoff, for up to
WRITE_RETRY_S and for as long as the sweep is not cancelled; the result waits in memory
meanwhile. Past that the batch goes back to Celery (workers.tasks retries it later) naming the
configs whose kernel came back, so their next run is not counted as a death.

A config that leaves the device context unusable (a sticky fault) is stored as `fault` and the
process ends right after (FAULT_EXIT); the task is acknowledged late and rejected on worker
loss, so Celery starts a fresh process and delivers the batch again, whose stored configs are
skipped. Each launch of a config's kernel is marked before it starts and the mark goes with its
result (repo.begin_config): a config that ends every process that runs it without a result (a
crash inside a driver, the OOM killer) is stored as `error` once MAX_STARTS processes died in
it, not delivered forever; a database or broker fault never counts.

A sweep that names a source bundle (a CI sweep of some commit) runs on a backend built from
that bundle, read from the store once per worker process; results then carry the bundle's hash,
and their reproducers say to check the commit out first. A sweep whose kernel is `commit:SHA` (a
commit with attnsweep.toml) runs the plug-in of that commit built on this host
(kernelsrc/build.py, once per host); a commit that does not build stores every config `error`
with the reason and the end of the build's log.
"""
from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any, Callable, Sequence, TypeVar

from attnconfig import parse_config
from isolation.executor import ConfigExecutor, Limits
from isolation.unrun import unrun_result
from kernelsrc.build import resolve_kernel
from settings import Settings
from kernels.source import KernelSource
from store import repo
from store.db import is_unreachable, session_scope
from store.kernels import note_kernel, sweep_kernel
from sweeps.datacache import DataCache
from sweeps.policy import gates_for
from sweeps.result import ConfigResult, at_commit
from workers.triage import sweep_ended

log = logging.getLogger(__name__)

__all__ = ["MAX_STARTS", "execute_batch"]

# Worker processes that may die while running one config's kernel before it is stored as
# `error` instead of being run again.
MAX_STARTS = 3
# How long a write the database refuses is retried in the process before the batch goes back
# to Celery; well inside the task's hard limit (settings.task_time_limit_s).
WRITE_RETRY_S = 300.0
WRITE_RETRY_MAX_DELAY_S = 15.0

T = TypeVar("T")


class ResultsNotStored(Exception):
    """The database refused a write for WRITE_RETRY_S: the batch goes back to Celery.
    `returned`: configs whose kernel came back but whose result was not stored."""

    def __init__(self, cause: BaseException, returned: Sequence[str]):
        super().__init__(f"{type(cause).__name__}: {first_line(cause)}")
        self.cause = cause
        self.returned = list(returned)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def retrying(what: str, write: Callable[[], T], cancelled: Callable[[], bool] | None = None,
             returned: Sequence[str] = (), budget_s: float | None = None) -> T | None:
    """write(), again after 0.5, 1, 2 ... WRITE_RETRY_MAX_DELAY_S s while the database cannot
    be reached or refuses it (SQLAlchemy's OperationalError: a full disk, a server restarting).
    None once `cancelled()` says the sweep was cancelled meanwhile. After `budget_s`, raises
    ResultsNotStored naming `returned`; `budget_s` defaults to WRITE_RETRY_S."""
    delay, deadline = 0.5, time.monotonic() + (WRITE_RETRY_S if budget_s is None else budget_s)
    while True:
        try:
            return write()
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise ResultsNotStored(exc, returned) from exc
            log.warning("%s: the database refused it (%s: %s); retried in %.1f s", what, type(exc).__name__,
                        first_line(exc), delay)
        time.sleep(delay)
        delay = min(delay * 2, WRITE_RETRY_MAX_DELAY_S)
        if cancelled is not None and cancelled():
            log.warning("%s: its sweep was cancelled meanwhile; dropped", what)
            return None


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
    returned: Sequence[str] = (),
) -> dict[str, int]:
    """Run the queued configs among `items` ([config_hash, config dict] pairs) and record each.

    Returns counts of outcomes, plus "skipped" for configs already recorded or cancelled and
    "late" for results another worker had stored first. The call that ends the sweep publishes
    its triage task with `celery` (the task's app; without one the reconciler publishes it).
    `returned`: configs of an earlier try of this batch whose kernel came back but whose result
    the database refused; running them again is not counted as a start. Raises
    ResultsNotStored when the database refuses a write for WRITE_RETRY_S.
    """
    url = settings.database_url
    defects = frozenset(defects)
    returned = frozenset(returned)
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
    kernel, unbuilt = resolve_kernel(kernel, settings) if pending else (kernel, None)
    executor = ConfigExecutor(backend_name, defects, Limits.of(settings), source,
                              sanitize=sanitize[0] if sanitize else None,
                              sanitize_hashes=sanitize[1] if sanitize else frozenset(), kernel=kernel,
                              data=DataCache.from_settings(settings), exit_process=exit_process)
    store = Store(settings, sweep_id, worker, celery, commit)
    for config_hash, config_json in items:
        if config_hash not in pending:
            counts["skipped"] += 1
            continue
        starts = store.begin(config_hash, count=config_hash not in returned)
        if starts is None:
            # Stored since the batch began (another worker took this batch over while this one
            # was stopped past its lease), or its sweep was cancelled.
            log.info("sweep %s config %s: stored by another worker, or cancelled; skipped", sweep_id, config_hash)
            counts["skipped"] += 1
            continue
        config = parse_config(config_json)

        def record_stuck(result: ConfigResult, h: str = config_hash) -> None:
            log.error("sweep %s config %s: stuck past the time limit; recording timeout and restarting", sweep_id, h)
            store.record(h, result)

        gates = gates_for(config, err_ratio_gate=err_ratio_gate)
        if starts > MAX_STARTS:
            result = unrun_result(config, None, backend_name, gates, "error",
                                  f"{starts - 1} worker processes ended while running this config's kernel "
                                  "without storing a result (a crash in a driver, or killed); not run again", kernel=kernel)
        elif unbuilt is not None:
            result = unrun_result(config, None, backend_name, gates, "error", unbuilt, kernel=kernel)
        elif source_hash and source is None:
            result = unrun_result(config, None, backend_name, gates, "error",
                                  f"source bundle {source_hash} of this sweep is not in the store", kernel=kernel)
        else:
            result = executor.run(config, gates, record_stuck)
        stored = store.record(config_hash, result)
        counts[result.outcome if stored else "late"] += 1
        if result.poisons_process:
            # Nothing may touch this context again: Celery replaces the process and delivers
            # the batch again, whose stored configs are skipped.
            log.error("sweep %s config %s: device fault; ending this worker process", sweep_id, config_hash)
            executor.fault_exit()
            return dict(counts)
    if not pending and status in repo.ACTIVE_STATUSES:
        # A batch delivered again after its worker died between a result and the check below.
        store.finish()
    return dict(counts)


class Store:
    """A batch's writes, each retried while the database refuses it (`retrying`)."""

    def __init__(self, settings: Settings, sweep_id: int, worker: str | None, celery: Any, commit: str | None):
        self.settings, self.sweep_id, self.worker, self.celery, self.commit = settings, sweep_id, worker, celery, commit
        self.url = settings.database_url

    def cancelled(self) -> bool:
        try:
            with session_scope(self.url) as s:
                return repo.sweep_status(s, self.sweep_id) == "cancelled"
        except Exception as exc:  # noqa: BLE001 - unknown: the next write finds out
            if not is_unreachable(exc):
                raise
            return False

    def begin(self, config_hash: str, count: bool) -> int | None:
        def write() -> int | None:
            with session_scope(self.url) as s:
                return repo.begin_config(s, self.sweep_id, config_hash, count)

        return retrying(f"sweep {self.sweep_id} config {config_hash}: marking its start", write)

    def record(self, config_hash: str, result: ConfigResult) -> bool:
        """Store the result and clear the config's start mark; False when another worker had
        stored the config first (this result is discarded) or the sweep was cancelled meanwhile."""
        if self.commit:
            result.reproducer = at_commit(result.reproducer, self.commit)
        what = f"sweep {self.sweep_id} config {config_hash}: storing its result ({result.outcome})"

        def write() -> bool:
            with session_scope(self.url) as s:
                stored = repo.record_result(s, self.sweep_id, config_hash, result.to_row(), worker=self.worker,
                                            clear_start=True)
                if stored and result.kernel_version:
                    note_kernel(s, self.sweep_id, result.kernel, result.kernel_version)
                return stored

        stored = retrying(what, write, self.cancelled, returned=[config_hash])
        if stored is None:
            return False
        if not stored:
            log.warning("sweep %s config %s: another worker stored it first (this worker's task went to it, "
                        "e.g. while this one was stopped past its lease); this run's result (%s) discarded",
                        self.sweep_id, config_hash, result.outcome)
            return False
        self.finish()
        return True

    def finish(self) -> None:
        """running -> done if nothing is left queued, after the result's own commit
        (repo.finish_if_complete); the triage task follows."""
        def write() -> bool:
            with session_scope(self.url) as s:
                return repo.finish_if_complete(s, self.sweep_id)

        if retrying(f"sweep {self.sweep_id}: ending it", write):
            sweep_ended(self.settings, self.sweep_id, self.celery)
