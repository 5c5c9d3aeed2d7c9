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

# Defects that can be compiled into the kernels (and honoured by the cpu emulation) to prove
# that a sweep catches the bug classes of rocMLIR's split-KV history: wrong numbers
# (NUMERIC_DEFECTS), and faults a sweep must survive and attribute to their configs.
DEFECTS = {
    "no_neginf_guard": "online softmax computes exp(m_old - m_new) without the -inf - (-inf) guard",
    "floor_blocks_per_split": "blocks per split by floor division (0 iterations when n_blocks < split_kv)",
    "no_zero_sum_guard": "final scaling divides acc by l without the l == 0 guard",
    "causal_off_by_one": "causal mask hides key j == q + prefix (an off-by-one in the causal bound)",
    "oob_store": "the combine stores the last row's output 1 TiB past O (a device fault on a GPU; split_kv > 1)",
    "oob_store_small": "the combine stores the last row's last value 2 elements past the end of O (no fault; split_kv > 1)",
    "missing_barrier": "the combine reads its thread groups' sums without the barrier that orders them (a race; split_kv > 1)",
    "hang": "the combine spins forever on the last row (split_kv > 1)",
}

NUMERIC_DEFECTS = ("no_neginf_guard", "floor_blocks_per_split", "no_zero_sum_guard", "causal_off_by_one")
FAULT_DEFECTS = ("oob_store", "oob_store_small", "missing_barrier", "hang")

# Defect switches compiled into the combine kernel (attn_splitkv_combine) alone.
COMBINE_DEFECTS = frozenset({"oob_store", "oob_store_small", "missing_barrier", "hang"})

# Defects the cpu emulation has no model of: a race needs threads that share memory.
GPU_ONLY_DEFECTS = frozenset({"missing_barrier"})


class BackendUnavailable(RuntimeError):
    """The runtime this backend needs is not on this host (no GPU, no driver, no library)."""


class NotApplicable(Exception):
    """A valid config this backend cannot run; `reason` is a short stable name for counting."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class CompileError(Exception):
    """The kernel failed to compile (or compiling timed out); `log` is the compiler's output."""

    def __init__(self, message: str, log: str = "", timed_out: bool = False):
        self.log = log
        self.timed_out = timed_out
        super().__init__(message)


class LaunchError(Exception):
    """The kernel failed at launch or while running (driver error, illegal address...)."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(message)


class DeviceOutOfMemory(Exception):
    """An allocation on the device failed."""


class DeviceFault(Exception):
    """The config's kernels did something a correct kernel never does: an illegal or misaligned
    access, a trap, a store into a guard zone. `poisons`: the driver made the error sticky, so
    the process's context is unusable and the process must be replaced before another config
    runs (every later driver call would fail with the same error)."""

    def __init__(self, message: str, poisons: bool):
        self.poisons = poisons
        super().__init__(message)


@dataclass(frozen=True)
class DeviceInfo:
    backend: str            # "cpu", "cuda", "hip"
    device: str             # human-readable device name; the cpu backend says it emulates
    total_memory: int | None  # bytes; None when no GPU can be queried (prefilter falls back)
    driver_version: str = ""
    compiler_version: str = ""
    arch: str = ""
    multiprocessors: int | None = None  # SMs / CUs: what the automatic split count sizes to


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
    run_s: float = 0.0               # device time of the launches (events), or wall time on cpu
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
