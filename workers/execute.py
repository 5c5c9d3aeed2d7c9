"""What a worker does with one batch of configs: run each through sweeps.runner.run_config.

The same `run_config` as the embedded runner; this module only adds what a queue needs:
skip configs already recorded (a batch delivered twice) or cancelled, the per-config time
limit, one transaction per result (a re-run replaces, never duplicates), and moving the sweep
queued -> running -> done.
"""
from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any, Callable, Sequence

from attnconfig import AttentionConfig, parse_config
from core.settings import Settings
from kernels.backend import Backend
from store import repo
from store.db import session_scope
from sweeps.policy import gates_for
from sweeps.result import ConfigResult, reproducer_command
from sweeps.runner import run_config
from workers.timelimit import ConfigTimeLimitExceeded, time_limit

log = logging.getLogger(__name__)

# Exit status of a worker process ended by the watchdog (Celery replaces the process).
WATCHDOG_EXIT = 70


class BackendCache:
    """One backend per (name, defects) per worker process: a worker compiles a variant once."""

    def __init__(self) -> None:
        self._backends: dict[tuple[str, frozenset[str]], Backend] = {}

    def get(self, name: str, defects: frozenset[str]) -> Backend:
        key = (name, defects)
        if key not in self._backends:
            from kernels import get_backend

            self._backends[key] = get_backend(name, defects=defects)
        return self._backends[key]

    def drop(self, name: str, defects: frozenset[str]) -> None:
        """Forget a backend whose state a timed-out config may have broken; the next config makes a new one."""
        backend = self._backends.pop((name, defects), None)
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - its state is already suspect; a new one replaces it
                log.exception("closing backend %s after a timeout failed", name)


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
            settings: Settings, on_hard_timeout: Callable[[ConfigResult], None]) -> ConfigResult:
    """run_config under the per-config time limit; a timeout is a result, not an exception."""
    from kernels.backend import BackendUnavailable

    gates = gates_for(config, err_ratio_gate=err_ratio_gate)
    try:
        backend = BACKENDS.get(backend_name, defects)
    except BackendUnavailable as exc:
        return unrun_result(config, None, backend_name, gates, "error", f"backend {backend_name} unavailable on this worker: {exc}")
    limit = settings.config_time_limit_s
    t0 = time.perf_counter()

    def hard_timeout() -> None:
        detail = f"exceeded the per-config time limit of {limit:g} s and did not stop within {settings.config_time_grace_s:g} s more"
        on_hard_timeout(unrun_result(config, backend, backend_name, gates, "timeout", detail, time.perf_counter() - t0))

    try:
        with time_limit(limit, settings.config_time_grace_s, hard_timeout):
            return run_config(config, backend, gates)
    except ConfigTimeLimitExceeded as exc:
        BACKENDS.drop(backend_name, defects)
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
    url = settings.database_url
    defects = frozenset(defects)
    counts: Counter[str] = Counter()
    with session_scope(url) as s:
        status = repo.sweep_status(s, sweep_id)
        pending = repo.pending_hashes(s, sweep_id, [h for h, _ in items]) if status in repo.ACTIVE_STATUSES else set()
        if pending:
            repo.mark_running(s, sweep_id)
    if status is None:
        log.warning("sweep %s does not exist; %d configs dropped", sweep_id, len(items))
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
            _record(url, sweep_id, h, result, worker)
            exit_process(WATCHDOG_EXIT)

        result = run_one(config, backend_name, defects, err_ratio_gate, settings, record_and_exit)
        _record(url, sweep_id, config_hash, result, worker)
        counts[result.outcome] += 1
    if not pending and status in repo.ACTIVE_STATUSES:
        # A batch delivered again after its worker died between a result and the check below.
        with session_scope(url) as s:
            repo.finish_if_complete(s, sweep_id)
    return dict(counts)


def _record(url: str, sweep_id: int, config_hash: str, result: ConfigResult, worker: str | None) -> None:
    with session_scope(url) as s:
        repo.record_result(s, sweep_id, config_hash, result.to_row(), worker=worker)
    # After the commit above, in its own transaction: see repo.finish_if_complete.
    with session_scope(url) as s:
        repo.finish_if_complete(s, sweep_id)
