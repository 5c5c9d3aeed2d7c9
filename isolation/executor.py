"""Running one config in a long-lived process so that whatever it does stays its own.

The embedded pool (workers/embedded.py) and the Celery task (workers/execute.py) run every
config through `ConfigExecutor.run`, which adds to sweeps.runner.run_config what a long-lived
process needs:
- one backend per (name, defects, source bundle) per process (backend_cache.py): a variant is
  compiled once;
- the per-config time limit (timelimit.py): `timeout`, and a watchdog for a kernel that never
  returns to Python, which hands the caller the `timeout` result and then ends the process
  (WATCHDOG_EXIT);
- device faults: a config whose kernel left a sticky error in the context is stored as `fault`
  and `ConfigResult.poisons_process` is set. The caller stores or hands on that result and
  then calls `fault_exit`, which ends the process (FAULT_EXIT) before anything else touches
  the context; its parent (Celery's pool, or the embedded pool) starts a fresh process, where
  the configs not yet stored run;
- sanitizer runs: a config picked for compute-sanitizer runs in a child process under it
  (sanitize.py) instead of in this one;
- the result of a config that did not run (unrun.py): a backend this host lacks, a timeout.

The caller computes a config's gates once (sweeps.policy.gates_for) and passes them along.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from attnconfig import AttentionConfig
from isolation.backend_cache import BACKENDS, BackendCache
from isolation.sanitize import run_sanitized
from isolation.timelimit import ConfigTimeLimitExceeded, time_limit, timeout_detail
from isolation.unrun import unrun_result
from kernels.backends.base import Backend, BackendUnavailable
from kernels.source import KernelSource
from sweeps.datacache import DataCache
from sweeps.result import ConfigResult
from sweeps.runner import run_config

log = logging.getLogger(__name__)

# Exit status of a worker process ended by the watchdog, and of one ended after a device fault
# (its context is unusable). Celery and the embedded pool replace the process either way.
WATCHDOG_EXIT = 70
FAULT_EXIT = 71


@dataclass(frozen=True)
class Limits:
    """The per-config time limit and the watchdog's grace after it (seconds; 0: no limit)."""

    config_s: float
    grace_s: float

    @classmethod
    def of(cls, settings: Any) -> "Limits":
        return cls(settings.config_time_limit_s, settings.config_time_grace_s)


@dataclass
class ConfigExecutor:
    """Runs configs of one sweep's kind (backend, defects, source bundle) in this process."""

    backend_name: str
    defects: frozenset[str] = frozenset()
    limits: Limits = Limits(0.0, 0.0)
    source: KernelSource | None = None
    sanitize: str | None = None              # a compute-sanitizer tool for the configs picked
    sanitize_hashes: frozenset[str] = frozenset()
    backends: BackendCache = field(default_factory=lambda: BACKENDS)
    #: the backend in use already exists (the embedded pool loads it while it draws inputs)
    backend_factory: Callable[[], Backend] | None = None
    #: the kernel under test (kernels/plugins): the project's own, or a plug-in's spec
    kernel: str = "attnsweep"
    #: the host's cache of inputs and references (sweeps/datacache.py); None: every config computes them
    data: DataCache | None = None
    #: ends this process with a status (the watchdog's and the fault's); a test stands in for it
    exit_process: Callable[[int], None] = os._exit

    def backend(self) -> Backend:
        return self.backends.get(self.backend_name, self.defects, self.source, self.backend_factory, self.kernel)

    def run(self, config: AttentionConfig, gates: dict[str, Any], on_hard_timeout: Callable[[ConfigResult], None],
            drawn: tuple[Any, float] | None = None) -> ConfigResult:
        """Run and judge `config` by `gates` (sweeps.policy.gates_for of the config and the
        sweep's err_ratio_gate). Never raises for the config's own failures: a timeout, a fault,
        a backend this host lacks are results. `on_hard_timeout` gets the `timeout` result of a
        config stuck in C past the limit and its grace, from the watchdog thread; it must store
        or hand it on, and the process ends (WATCHDOG_EXIT) when it returns."""
        try:
            backend = self.backend()
        except BackendUnavailable as exc:
            return unrun_result(config, None, self.backend_name, gates, "error",
                                f"backend {self.backend_name} unavailable on this worker: {exc}", kernel=self.kernel)
        if self.sanitize and config.content_hash() in self.sanitize_hashes:
            from isolation.confined import ConfinedBackend

            if isinstance(backend, ConfinedBackend):
                return unrun_result(config, backend, self.backend_name, gates, "error",
                                    "sanitize: a fetched commit's kernels run confined, and compute-sanitizer does "
                                    "not run inside the confinement; sweep the commit without sanitize")
            return run_sanitized(config, backend, gates, self.sanitize, self.limits.config_s)
        t0 = time.perf_counter()

        def hard_timeout() -> None:
            detail = (f"exceeded the per-config time limit of {self.limits.config_s:g} s and did not stop "
                      f"within {self.limits.grace_s:g} s more")
            on_hard_timeout(unrun_result(config, backend, self.backend_name, gates, "timeout", detail,
                                         time.perf_counter() - t0))
            self.exit_process(WATCHDOG_EXIT)

        try:
            with time_limit(self.limits.config_s, self.limits.grace_s, hard_timeout):
                result = run_config(config, backend, gates, drawn=drawn, data=self.data)
        except ConfigTimeLimitExceeded as exc:
            self.backends.drop(self.backend_name, self.defects, self.source, self.kernel)
            return unrun_result(config, backend, self.backend_name, gates, "timeout", timeout_detail(exc),
                                time.perf_counter() - t0)
        if result.poisons_process or backend.poisoned:
            result.poisons_process = True
            log.error("config %s faulted on the device (%s); this process's context is unusable",
                      config.content_hash(), result.detail.splitlines()[0] if result.detail else "")
        return result

    def fault_exit(self) -> None:
        """End this process (FAULT_EXIT) once the result that poisoned its context is stored or
        handed on: nothing may touch the context again, and the parent starts a fresh process."""
        self.exit_process(FAULT_EXIT)
