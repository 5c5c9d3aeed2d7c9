"""What a worker does with one batch of configs: run each through sweeps.runner.run_config.

The same `run_config` as the embedded runner; this module only adds what a queue needs:
skip configs already recorded (a batch delivered twice) or cancelled, the per-config time
limit, one transaction per result (a re-run replaces, never duplicates), and moving the sweep
queued -> running -> done.

A sweep that names a source bundle (a CI sweep of some commit) runs on a backend built from
that bundle, read from the store once per worker process; results then carry the bundle's hash,
and their reproducers say to check the commit out first.
"""
from __future__ import annotations

import logging
import os
import shlex
import time
from collections import Counter, OrderedDict
from typing import Any, Callable, Sequence

from attnconfig import AttentionConfig, parse_config
from core.settings import Settings
from kernels.backend import Backend
from kernels.source import KernelSource
from store import repo
from store.db import session_scope
from sweeps.heap import retain_freed_memory
from sweeps.policy import gates_for
from sweeps.result import ConfigResult, reproducer_command
from sweeps.runner import run_config
from workers.timelimit import ConfigTimeLimitExceeded, time_limit

log = logging.getLogger(__name__)

# Exit status of a worker process ended by the watchdog (Celery replaces the process).
WATCHDOG_EXIT = 70


BackendKey = tuple[str, frozenset[str], str | None]


class BackendCache:
    """One backend per (name, defects, source bundle) per worker process: a worker compiles a
    variant once. Each commit a CI sweep tests is a bundle of its own; the least recently used
    backends beyond `limit` are closed, so a long-lived worker does not keep every revision's
    modules loaded."""

    def __init__(self, limit: int = 8) -> None:
        self._backends: OrderedDict[BackendKey, Backend] = OrderedDict()
        self.limit = limit

    def get(self, name: str, defects: frozenset[str], source: KernelSource | None = None) -> Backend:
        key = (name, defects, source.hash if source is not None else None)
        if key not in self._backends:
            from kernels import get_backend

            self._backends[key] = get_backend(name, defects=defects, source=source)
            while len(self._backends) > self.limit:
                old_key, _ = next(iter(self._backends.items()))
                self._close(old_key)
        self._backends.move_to_end(key)
        return self._backends[key]

    def drop(self, name: str, defects: frozenset[str], source: KernelSource | None = None) -> None:
        """Forget a backend whose state a timed-out config may have broken; the next config makes a new one."""
        self._close((name, defects, source.hash if source is not None else None))

    def _close(self, key: BackendKey) -> None:
        backend = self._backends.pop(key, None)
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - its state is already suspect; a new one replaces it
                log.exception("closing backend %s failed", key[0])


class BundleCache:
    """Source bundles read from the store, by hash (content-addressed: never stale)."""

    def __init__(self) -> None:
        self._bundles: dict[str, KernelSource] = {}

    def get(self, url: str, key: str) -> KernelSource | None:
        if key not in self._bundles:
            from kernelsrc.bundles import load_bundle

            with session_scope(url) as s:
                source = load_bundle(s, key)
            if source is None:
                return None
            self._bundles[key] = source
        return self._bundles[key]


BUNDLES = BundleCache()


BACKENDS = BackendCache()


def unrun_result(config: AttentionConfig, backend: Backend | None, backend_name: str, gates: dict[str, Any],
                 outcome: str, detail: str, total_s: float | None = None) -> ConfigResult:
    """A result for a config that did not finish (timeout) or could not start (no such backend here)."""
    info = backend.device_info() if backend is not None else None
    result = ConfigResult(
        config=config, outcome=outcome, detail=detail, gates=gates,
        backend=info.backend if info else backend_name, device=info.device if info else "",
        driver_version=info.driver_version if info else "", compiler_version=info.compiler_version if info else "",
        reproducer=reproducer_command(config, info.backend if info else backend_name, gates,
                                      backend.defects if backend is not None else frozenset()),
    )
    if total_s is not None:
        result.timings["total_s"] = total_s
    return result


def run_one(config: AttentionConfig, backend_name: str, defects: frozenset[str], err_ratio_gate: float | None,
            settings: Settings, on_hard_timeout: Callable[[ConfigResult], None],
            source: KernelSource | None = None) -> ConfigResult:
    """run_config under the per-config time limit; a timeout is a result, not an exception."""
    from kernels.backend import BackendUnavailable

    gates = gates_for(config, err_ratio_gate=err_ratio_gate)
    try:
        backend = BACKENDS.get(backend_name, defects, source)
    except BackendUnavailable as exc:
        return unrun_result(config, None, backend_name, gates, "error", f"backend {backend_name} unavailable on this worker: {exc}")
    limit = settings.config_time_limit_s
    t0 = time.perf_counter()

    def hard_timeout() -> None:
        detail = f"exceeded the per-config time limit of {limit:g} s and did not stop within {settings.config_time_grace_s:g} s more"
        on_hard_timeout(unrun_result(config, backend, backend_name, gates, "timeout", detail, time.perf_counter() - t0))

    try:
        with time_limit(limit, settings.config_time_grace_s, hard_timeout):
            return run_config(config, backend, gates, overlap=None if settings.overlap_device else False)
    except ConfigTimeLimitExceeded as exc:
        BACKENDS.drop(backend_name, defects, source)
        return unrun_result(config, backend, backend_name, gates, "timeout", str(exc), time.perf_counter() - t0)


def execute_batch(
    settings: Settings,
    sweep_id: int,
    items: Sequence[Sequence[Any]],
    backend_name: str,
    defects: Sequence[str] = (),
    err_ratio_gate: float | None = None,
    worker: str | None = None,
    exit_process: Callable[[int], None] = os._exit,
) -> dict[str, int]:
    """Run the queued configs among `items` ([config_hash, config dict] pairs) and record each.

    Returns counts of outcomes, plus "skipped" for configs already recorded or cancelled.
    """
    retain_freed_memory(settings.heap_retain_mb)
    url = settings.database_url
    defects = frozenset(defects)
    counts: Counter[str] = Counter()
    with session_scope(url) as s:
        status = repo.sweep_status(s, sweep_id)
        pending = repo.pending_hashes(s, sweep_id, [h for h, _ in items]) if status in repo.ACTIVE_STATUSES else set()
        if pending:
            repo.mark_running(s, sweep_id)
        source_hash, commit = repo.sweep_revision(s, sweep_id)
    if status is None:
        log.warning("sweep %s does not exist; %d configs dropped", sweep_id, len(items))
    source = BUNDLES.get(url, source_hash) if source_hash and pending else None
    for i, (config_hash, config_json) in enumerate(items):
        if config_hash not in pending:
            counts["skipped"] += 1
            continue
        with session_scope(url) as s:
            if repo.sweep_status(s, sweep_id) == "cancelled":
                counts["skipped"] += len(items) - i
                break
        config = parse_config(config_json)

        def record_and_exit(result: ConfigResult, h: str = config_hash) -> None:
            log.error("sweep %s config %s: stuck past the time limit; recording timeout and restarting", sweep_id, h)
            if commit:
                result.reproducer = at_commit(result.reproducer, commit)
            _record(url, sweep_id, h, result, worker)
            exit_process(WATCHDOG_EXIT)

        if source_hash and source is None:
            result = unrun_result(config, None, backend_name, gates_for(config, err_ratio_gate=err_ratio_gate), "error",
                                  f"source bundle {source_hash} of this sweep is not in the store")
        else:
            result = run_one(config, backend_name, defects, err_ratio_gate, settings, record_and_exit, source)
        if commit:
            result.reproducer = at_commit(result.reproducer, commit)
        _record(url, sweep_id, config_hash, result, worker)
        counts[result.outcome] += 1
    if not pending and status in repo.ACTIVE_STATUSES:
        # A batch delivered again after its worker died between a result and the check below.
        with session_scope(url) as s:
            repo.finish_if_complete(s, sweep_id)
    return dict(counts)


def at_commit(reproducer: str, commit: str) -> str:
    """The reproducer of a result of a kernel revision: run in a checkout of that commit."""
    return f"git checkout {shlex.quote(commit)} && {reproducer}" if reproducer else reproducer


def _record(url: str, sweep_id: int, config_hash: str, result: ConfigResult, worker: str | None) -> None:
    with session_scope(url) as s:
        repo.record_result(s, sweep_id, config_hash, result.to_row(), worker=worker)
    # After the commit above, in its own transaction: see repo.finish_if_complete.
    with session_scope(url) as s:
        repo.finish_if_complete(s, sweep_id)
