"""Running one config in a worker process so that whatever it does stays its own.

The embedded pool (workers/embedded.py) and the Celery task (workers/execute.py) run every
config through `ConfigExecutor.run`, which adds to sweeps.runner.run_config what a long-lived
process needs:
- one backend per (name, defects, source bundle) per process (BackendCache): a variant is
  compiled once;
- the per-config time limit (isolation/timelimit.py): `timeout`, and a watchdog for a kernel that
  never returns to Python, which hands the caller the `timeout` result and ends the process;
- device faults: a config whose kernel left a sticky error in the context is stored as `fault`
  and `ConfigResult.poisons_process` is set. The caller stores that result and then ends the
  process (FAULT_EXIT) before anything else touches the context; its parent (Celery's pool, or
  the embedded pool) starts a fresh process, where the configs not yet stored run;
- sanitizer runs: a config picked for compute-sanitizer runs in a child process under it
  (isolation/sanitize.py) instead of in this one.

The caller computes a config's gates once (sweeps.policy.gates_for) and passes them along.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from attnconfig import AttentionConfig
from kernels.backends.base import Backend, BackendUnavailable
from kernels.source import KernelSource
from sweeps.datacache import DataCache
from sweeps.result import ConfigResult, unrun_result
from sweeps.runner import run_config
from isolation.sanitize import run_sanitized
from isolation.timelimit import ConfigTimeLimitExceeded, time_limit

log = logging.getLogger(__name__)

# Exit status of a worker process ended by the watchdog, and of one ended after a device fault
# (its context is unusable). Celery and the embedded pool replace the process either way.
WATCHDOG_EXIT = 70
FAULT_EXIT = 71

BackendKey = tuple[str, frozenset[str], str | None, str]


class BackendCache:
    """One backend per (name, defects, source bundle) per worker process: a worker compiles a
    variant once. Each commit a CI sweep tests is a bundle of its own; the least recently used
    backends beyond `limit` are closed, so a long-lived worker does not keep every revision's
    modules loaded."""

    def __init__(self, limit: int = 8) -> None:
        self._backends: OrderedDict[BackendKey, Backend] = OrderedDict()
        self.limit = limit

    def get(self, name: str, defects: frozenset[str], source: KernelSource | None = None,
            factory: Callable[[], Backend] | None = None, kernel: str = "attnsweep") -> Backend:
        key = (name, defects, source.hash if source is not None else None, kernel)
        if key not in self._backends:
            if factory is None:
                # A source or a plug-in that did not ship (a fetched commit's) runs confined (isolation/).
                from isolation.confined import backend_for

                factory = lambda: backend_for(name, defects=defects, source=source, kernel=kernel)  # noqa: E731
            self._backends[key] = factory()
            while len(self._backends) > self.limit:
                old_key, _ = next(iter(self._backends.items()))
                self._close(old_key)
        self._backends.move_to_end(key)
        return self._backends[key]

    def drop(self, name: str, defects: frozenset[str], source: KernelSource | None = None,
             kernel: str = "attnsweep") -> None:
        """Forget a backend whose state a timed-out config may have broken; the next config makes a new one."""
        self._close((name, defects, source.hash if source is not None else None, kernel))

    def _close(self, key: BackendKey) -> None:
        backend = self._backends.pop(key, None)
        if backend is not None and not backend.poisoned:   # a poisoned context goes with its process
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - its state is already suspect; a new one replaces it
                log.exception("closing backend %s failed", key[0])


BACKENDS = BackendCache()


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

    def backend(self) -> Backend:
        return self.backends.get(self.backend_name, self.defects, self.source, self.backend_factory, self.kernel)

    def run(self, config: AttentionConfig, gates: dict[str, Any], on_hard_timeout: Callable[[ConfigResult], None],
            drawn: tuple[Any, float] | None = None) -> ConfigResult:
        """Run and judge `config` by `gates` (sweeps.policy.gates_for of the config and the
        sweep's err_ratio_gate). Never raises for the config's own failures: a timeout, a fault,
        a backend this host lacks are results. `on_hard_timeout` gets the `timeout` result of a
        config stuck in C past the limit and its grace, from the watchdog thread; it must store
        or hand it on and end the process."""
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

        try:
            with time_limit(self.limits.config_s, self.limits.grace_s, hard_timeout):
                result = run_config(config, backend, gates, drawn=drawn, data=self.data)
        except ConfigTimeLimitExceeded as exc:
            self.backends.drop(self.backend_name, self.defects, self.source, self.kernel)
            # The notes say where the limit stopped it, where the backend knows (the cpu
            # emulation's combine); triage locates the timeout by them.
            detail = "\n".join([str(exc), *getattr(exc, "__notes__", ())])
            return unrun_result(config, backend, self.backend_name, gates, "timeout", detail,
                                time.perf_counter() - t0)
        if result.poisons_process or backend.poisoned:
            result.poisons_process = True
            log.error("config %s faulted on the device (%s); this process's context is unusable",
                      config.content_hash(), result.detail.splitlines()[0] if result.detail else "")
        return result

