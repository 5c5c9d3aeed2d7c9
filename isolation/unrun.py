"""The result of a config that did not run: it ran out of time, its process died, its backend is
not on this host, or the sanitizer or a source bundle could not be had. Every such result is
built here, so it carries the device facts and the reproducer a run's result would."""
from __future__ import annotations

from typing import Any

from attnconfig import AttentionConfig
from sweeps.result import ConfigResult, new_result


def unrun_result(config: AttentionConfig, backend: Any, backend_name: str, gates: dict[str, Any],
                 outcome: str, detail: str, total_s: float | None = None,
                 defects: frozenset[str] = frozenset(), kernel: str = "attnsweep") -> ConfigResult:
    """A result for a config that did not finish (timeout) or could not start (no such backend
    here). `backend`: the kernels.backends.base.Backend it was to run on, None where there is none."""
    info = None
    if backend is not None and not backend.poisoned:
        try:
            info = backend.device_info()
        except Exception:  # noqa: BLE001 - a stuck or broken device still gets its config stored
            info = None
    result = new_result(config, gates, backend_name, backend.defects if backend is not None else defects,
                        info, outcome, detail, kernel)
    if total_s is not None:
        result.timings["total_s"] = total_s
    return result
