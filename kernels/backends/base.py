"""The backend interface every kernel runtime implements (cpu emulation, CUDA, HIP).

A backend prepares (compiles, or looks up in the compile cache) the kernel variant a config
needs, runs it on the config's inputs and hands back host arrays. Failures of a config are
typed exceptions that the runner turns into outcomes; anything else is a bug and propagates.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig

# The defect switches and failure types live below the backends (variant selection, launch
# plans and the compile cache use them too); importers of this module find them here as well.
from kernels.defects import COMBINE_DEFECTS, DATA_DEFECTS, DEFECTS, FAULT_DEFECTS, GPU_ONLY_DEFECTS, NUMERIC_DEFECTS  # noqa: F401
from kernels.errors import (  # noqa: F401
    BackendUnavailable,
    CompileError,
    ConfinementError,
    ConfinementTimeout,
    DeviceFault,
    DeviceOutOfMemory,
    LaunchError,
    NotApplicable,
    PluginError,
)


@dataclass(frozen=True)
class DeviceInfo:
    backend: str            # "cpu", "cuda", "hip"
    device: str             # human-readable device name; the cpu backend says it emulates
    total_memory: int | None  # bytes; None when no GPU can be queried (prefilter falls back)
    driver_version: str = ""
    compiler_version: str = ""
    arch: str = ""
    multiprocessors: int | None = None  # SMs / CUs: what the automatic split count sizes to
    # The kernel under test (kernels/plugins): how it was asked for (`--kernel`), its name and
    # version. Our own kernels are "attnsweep", versioned by the source a result names.
    kernel_spec: str = "attnsweep"
    kernel: str = "attnsweep"
    kernel_version: str = ""


@dataclass(frozen=True)
class Prepared:
    """A kernel variant ready to run: its deterministic name, tile size and source identity."""

    variant: str
    block_n: int
    source_hash: str
    compile_s: float = 0.0
    cache_hit: bool = False
    handle: Any = field(default=None, compare=False, repr=False)


@dataclass
class RunOutput:
    """Host copies of what the kernel wrote. Partials are f32, shaped [S, g, Hq, Sq, Dv] / [S, g, Hq, Sq]."""

    out: np.ndarray                  # logical layout [g, Hq, Sq, Dv], storage dtype (f16 for i8)
    lse: np.ndarray | None           # [g, Hq, Sq] (f32; f16 for i8) when return_lse
    o_partials: np.ndarray | None = None
    lse_partials: np.ndarray | None = None
    run_s: float = 0.0               # GPU time of the launches (events), or wall time on cpu
    transfer_s: float = 0.0


class Backend(abc.ABC):
    """One kernel runtime. Subclasses import their runtime lazily (in __init__ or later)."""

    name: str = "abstract"
    #: run() mostly waits on a device (copies, the kernel) instead of computing on this host's
    #: CPU, so sweeps.runner runs it in a thread beside the host reference
    waits_on_device: bool = False
    #: a sticky device error (DeviceFault with poisons) left this backend's context unusable:
    #: nothing may run on it again in this process
    poisoned: bool = False

    def __init__(self, defects: frozenset[str] = frozenset()):
        unknown = set(defects) - set(DEFECTS)
        if unknown:
            raise ValueError(f"defects: unknown defect(s) {sorted(unknown)}; known: {sorted(DEFECTS)}")
        self.defects = frozenset(defects)

    @abc.abstractmethod
    def device_info(self) -> DeviceInfo: ...

    @abc.abstractmethod
    def prepare(self, config: AttentionConfig) -> Prepared:
        """Pick and compile (or load from cache) the variant for this config.

        Raises NotApplicable or CompileError."""

    @abc.abstractmethod
    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        """Copy inputs in (physical layouts per trans_*), launch, synchronize, copy out.

        Output buffers are filled with NaN before the launch, so a kernel that writes nothing
        fails. Raises LaunchError or DeviceOutOfMemory."""

    def device_count(self) -> int:
        """GPUs this backend's runtime sees (after CUDA_/HIP_VISIBLE_DEVICES); 0: it runs on none."""
        return 0

    def close(self) -> None:
        """Release device resources (contexts, modules). Safe to call twice."""
