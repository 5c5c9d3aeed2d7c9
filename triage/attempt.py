"""One real run of one config for triage: its signature, a digest of its output bits, a time limit.

Shrinking, classification and bisection all judge a config by running it exactly as a sweep
does (sweeps.runner.run_config, with the sweep policy's gates for that config), so a minimal
config fails for the reason the sweep saw. Three things are added here, for triage only:
- the digest of what the kernel wrote (O and LSE bytes, NaN payloads included): two runs of the
  same inputs that differ in a bit are not deterministic, even when both pass;
- a time limit (isolation.timelimit, a sweep's own, on the config's running time: SIGALRM in
  the main thread only, since a hanging kernel emulation is Python code that the signal
  interrupts), so a `hang` defect is a `timeout` instead of a stuck triage;
- a fresh backend after a run that left it unusable (a sticky device fault poisons it);
- on the device backends, every run in a child process (isolation.child): a GPU's sticky fault
  outlives its backend, and a hung kernel does not return to the signal.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from attnconfig import AttentionConfig
from isolation.child import ChildRunner
from isolation.confined import backend_for, is_shipped
from isolation.timelimit import ConfigTimeLimitExceeded, time_limit, timeout_detail
from kernels.plugins import is_trusted
from kernels.backends.base import Backend, CompileError, DeviceInfo, NotApplicable, Prepared, RunOutput
from kernels.source import KernelSource
from sweeps.policy import gates_for
from sweeps.runner import run_config
from triage.signature import Signature, location_of


@dataclass(frozen=True)
class Observation:
    outcome: str
    failed_gate: str | None
    location: str       # triage.signature.location_of: the kernel family, or `combine`
    digest: str | None  # sha256 of O and LSE as returned; None when the kernel returned nothing
    detail: str = ""

    @property
    def signature(self) -> Signature:
        return Signature(self.outcome, self.failed_gate, self.location)


def output_digest(out: RunOutput) -> str:
    h = hashlib.sha256()
    for array in (out.out, out.lse):
        if array is not None:
            h.update(str(array.dtype).encode() + str(array.shape).encode())
            h.update(array.tobytes())
    return h.hexdigest()


def unfinished(config: AttentionConfig, how: str, detail: str) -> Observation:
    """The Observation of a run that did not finish: a timeout, or an error when its process died."""
    outcome = "timeout" if how == "timeout" else "error"
    return Observation(outcome, None, location_of(config, outcome, None, None, detail=detail), None, detail)


class _Digesting(Backend):
    """The backend as run_config sees it, keeping the digest of the last run's outputs."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.name = inner.name
        self.defects = inner.defects
        self.digest: str | None = None

    @property
    def waits_on_device(self) -> bool:  # type: ignore[override]
        return self.inner.waits_on_device

    @property
    def poisoned(self) -> bool:  # type: ignore[override]
        return self.inner.poisoned

    def device_info(self) -> DeviceInfo:
        return self.inner.device_info()

    def prepare(self, config: AttentionConfig) -> Prepared:
        return self.inner.prepare(config)

    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        out = self.inner.run(prepared, config, inputs)
        self.digest = output_digest(out)
        return out


# Backends whose runs go to a child process by default: those that drive a GPU.
ISOLATED_BACKENDS = frozenset({"auto", "cuda", "hip"})


class Runner:
    """Runs configs on one kind of backend (name, defects, source), counting the runs.

    `isolate` (default: for the backends of ISOLATED_BACKENDS, unless a `factory` is given) runs
    each config in a child process (isolation.child, triage/child_main.py) instead of this one."""

    def __init__(self, backend: str = "cpu", defects: frozenset[str] | tuple[str, ...] = frozenset(),
                 source: KernelSource | None = None, *, err_ratio_gate: float | None = None,
                 time_limit_s: float | None = 30.0, factory: Callable[[], Backend] | None = None,
                 isolate: bool | None = None, kernel: str = "attnsweep"):
        self.backend_name = backend
        self.defects = frozenset(defects)
        self.source = source
        self.kernel = kernel   # the kernel under test (kernels/plugins)
        self.err_ratio_gate = err_ratio_gate
        self.time_limit_s = time_limit_s
        # A source that did not ship (a fetched commit's) runs confined (isolation/): its own
        # process already, so no triage child besides.
        self._factory = factory or (lambda: backend_for(backend, defects=self.defects, source=source, kernel=kernel))
        self._backend: Backend | None = None
        self.runs = 0
        if isolate is None:
            isolate = factory is None and backend in ISOLATED_BACKENDS and (is_shipped(source) or backend == "cpu") \
                and is_trusted(kernel)
        self.child = ChildRunner({"backend": backend, "defects": sorted(self.defects), "kernel": kernel,
                                  "source_files": dict(source.files) if source is not None else None,
                                  "err_ratio_gate": err_ratio_gate, "time_limit_s": time_limit_s},
                                 main="triage.child_main", name="triage") if isolate else None

    @property
    def holds_usable_backend(self) -> bool:
        """Whether the backend of the last run can take the next: not after a fault that poisoned
        it, nor after a run its time limit stopped (closed then)."""
        return self._backend is not None and not self._backend.poisoned

    def backend(self) -> Backend:
        if self._backend is None or self._backend.poisoned:
            self._backend = self._factory()
        return self._backend

    def gates(self, config: AttentionConfig) -> dict[str, Any]:
        return gates_for(config, err_ratio_gate=self.err_ratio_gate)

    def compiles(self, config: AttentionConfig) -> tuple[bool, str]:
        """(False, the compiler's log) when the source does not compile for this config. Not a run."""
        if self.child is not None:
            how, value = self.child.call("compiles", config)
            return value if how == "ok" else (True, "")  # a compiler that hangs or crashes is not a log
        try:
            self.backend().prepare(config)
        except CompileError as exc:
            return False, f"{exc}\n{exc.log}"
        except NotApplicable:
            pass
        return True, ""

    def run(self, config: AttentionConfig) -> Observation:
        self.runs += 1
        if self.child is not None:
            how, value = self.child.call("run", config)
            return value if how == "ok" else unfinished(config, how, value)
        probe = _Digesting(self.backend())
        try:
            with time_limit(self.time_limit_s):
                result = run_config(config, probe, self.gates(config))
        except ConfigTimeLimitExceeded as exc:
            # A backend stopped in the middle of a run is not trusted with the next one.
            self.close()
            return unfinished(config, "timeout", timeout_detail(exc, f"exceeded the time limit of {self.time_limit_s:g} s"))
        digest = probe.digest if result.outcome in ("pass", "fail", "nan") else None
        location = location_of(config, result.outcome, result.failed_gate, result.variant, result.metrics,
                               result.gates, result.detail)
        return Observation(result.outcome, result.failed_gate, location, digest, result.detail)

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
        if self._backend is not None and not self._backend.poisoned:
            self._backend.close()
        self._backend = None
