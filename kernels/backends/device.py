"""The runtime-neutral GPU backend: everything the CUDA, HIP and hostemu backends share (variant
choice, the compile cache, buffers and their guard zones, NaN prefill, argument packing, the
launch plan, timing and copy-out), leaving them only the runtime calls (`_rt_*`: compile, load,
malloc, memcpy, memset, launch, events); and the host-side dtypes and NaN fills of a call's
buffers.
"""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes
from kernels.backends.base import (
    Backend,
    DeviceFault,
    DeviceOutOfMemory,
    LaunchError,
    Prepared,
    RunOutput,
)
from kernels.cache import Compiled, KernelCache
from kernels.defects import COMBINE_DEFECTS
from kernels.guards import CANARY, GUARD_BYTES, check_guards, fill_value_bits, padded_bytes
from kernels.launch import (
    DEFAULT_MAX_SHARED,
    Launch,
    fused_combine_counters,
    fused_combine_part_floats,
    fuses_combine,
    kernels_given,
    launch_plan,
)
from kernels.select import Variant, select_variant
from kernels.source import KernelSource, local_source
from reference.layout import to_logical, to_physical


def storage_dtypes(dtype: str) -> dict[str, np.dtype]:
    import ml_dtypes

    fl = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}
    if dtype == "i8":
        return {"qk": np.dtype(np.int8), "v": np.dtype(np.float16), "o": np.dtype(np.float16),
                "lse": np.dtype(np.float16)}
    return {"qk": fl[dtype], "v": fl[dtype], "o": fl[dtype], "lse": np.dtype(np.float32)}


# NaN bit patterns used to prefill outputs (a kernel that writes nothing then fails).
NAN_BITS = {2: 0x7E00, 4: 0x7FC00000}          # f16 quiet NaN; f32 quiet NaN
BF16_NAN_BITS = 0x7FC0


def output_buffers(config: AttentionConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The device buffers a call writes, by launch_plan's names: (physical shape, dtype). O in
    its layout, the LSE where asked for, and the split partials. DeviceBackend.run and
    bench/kernels.py allocate from here, so the benchmark times the writes a sweep runs."""
    c = config
    dt = storage_dtypes(c.dtype)
    o_shape = ((c.g, c.num_heads_q, c.head_dim_v, c.seq_len_q) if c.trans_o
               else (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v))
    outputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {"o": (o_shape, dt["o"])}
    if c.return_lse:
        outputs["lse"] = ((c.g, c.num_heads_q, c.seq_len_q), dt["lse"])
    if c.split_kv > 1:
        outputs["o_part"] = ((c.split_kv, c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), np.dtype(np.float32))
        outputs["lse_part"] = ((c.split_kv, c.g, c.num_heads_q, c.seq_len_q), np.dtype(np.float32))
    return outputs


def nan_fill_pattern(dtype: np.dtype) -> tuple[int, int]:
    """(element size, bit pattern) of a quiet NaN in `dtype`."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 4:
        return 4, NAN_BITS[4]
    if dtype == np.float16:
        return 2, NAN_BITS[2]
    if dtype.itemsize == 2:  # bfloat16
        return 2, BF16_NAN_BITS
    raise ValueError(f"no NaN pattern for {dtype}")


@dataclass
class LoadedVariant:
    """A variant loaded on the device: its module and the two functions."""

    variant: Variant
    module: Any
    functions: dict[str, Any] = field(default_factory=dict)


class DeviceBackend(Backend, abc.ABC):
    """The runtime-neutral GPU backend; subclasses implement the `_rt_*` runtime calls."""

    waits_on_device = True
    #: arch string for the cache key (sm_90, gfx942...); set by the subclass constructor
    arch: str = ""
    #: a source bundle to compile instead of the local kernels/src; set by the subclass constructor
    kernel_source: KernelSource | None = None

    @property
    def source(self) -> KernelSource:
        return self.kernel_source or self._local_source

    @cached_property
    def _local_source(self) -> KernelSource:
        # Read once: prepare asks for the hash of every config, and the hash and the text
        # compiled must come from one reading of kernels/src.
        return local_source()

    def __init__(self, defects: frozenset[str] = frozenset(), *, cache: Any = None):
        super().__init__(defects)
        self.cache = cache if cache is not None else KernelCache()
        self._loaded: dict[str, LoadedVariant] = {}
        self.last_alloc: dict[str, int] = {}   # bytes of each output buffer of the last run
        #: bytes of guard zone on each side of every input and output (kernels/guards.py);
        #: bench/sweep.py sets 0 to measure what they cost
        self.guard_bytes = GUARD_BYTES

    # -- runtime calls ------------------------------------------------------------------------
    @abc.abstractmethod
    def compiler_version(self) -> str: ...

    @abc.abstractmethod
    def compile_options(self, variant: Variant) -> list[str]: ...

    @abc.abstractmethod
    def _rt_compile(self, variant: Variant, options: list[str]) -> Compiled: ...

    @abc.abstractmethod
    def _rt_load(self, compiled: Compiled) -> Any: ...

    @abc.abstractmethod
    def _rt_get_function(self, module: Any, lowered_name: str) -> Any: ...

    def _rt_allow_shared(self, function: Any, nbytes: int) -> None:
        """Let `function` launch with `nbytes` of dynamic shared memory (past DEFAULT_MAX_SHARED
        a kernel must opt in); only the mma path asks for that much, and only CUDA runs it."""
        if nbytes > DEFAULT_MAX_SHARED:
            raise NotImplementedError(f"{self.name}: {nbytes} B of dynamic shared memory needs an opt-in")

    @abc.abstractmethod
    def _rt_malloc(self, nbytes: int) -> int: ...

    @abc.abstractmethod
    def _rt_free(self, dptr: int) -> None: ...

    @abc.abstractmethod
    def _rt_htod(self, dptr: int, host: np.ndarray) -> None: ...

    @abc.abstractmethod
    def _rt_dtoh(self, host: np.ndarray, dptr: int) -> None: ...

    @abc.abstractmethod
    def _rt_memset(self, dptr: int, elem_size: int, pattern: int, count: int) -> None: ...

    @abc.abstractmethod
    def _rt_launch(self, function: Any, launch: Launch) -> None: ...

    @abc.abstractmethod
    def _rt_event_pair(self) -> tuple[Any, Any]: ...

    @abc.abstractmethod
    def _rt_record(self, event: Any) -> None: ...

    @abc.abstractmethod
    def _rt_elapsed_s(self, start: Any, stop: Any) -> float:
        """Synchronize on `stop` and return the time between the two events in seconds."""

    @abc.abstractmethod
    def _rt_event_destroy(self, event: Any) -> None: ...

    @abc.abstractmethod
    def _rt_activate(self) -> None:
        """Make this backend's device current in the calling thread."""

    # -- prepare --------------------------------------------------------------------------------
    #: "auto" (the fastest path that applies), or a path of PATHS to force it (tests, benchmarks)
    kernel_path: str = "auto"
    #: whether the device runs the mma path (NVIDIA sm_80+); set by the subclass constructor
    mma_capable: bool = False
    #: whether the mma decode kernel combines the splits itself (fuses_combine); False: two launches
    fuse_combine: bool = True

    def variant_for(self, config: AttentionConfig) -> Variant:
        return select_variant(config, self.defects, self.kernel_path, mma=self.mma_capable)

    def combine_counters(self, config: AttentionConfig, variant: Variant) -> int:
        """int32 counters a call needs, zeroed (fused_combine_counters), when the split kernel
        combines itself (fuse_combine and fuses_combine); 0: the combine kernel runs."""
        # A combine defect #defined in the source (a bundle's switches) lives in the combine
        # kernel as one passed as an option does: the variant runs it, not the fused combine.
        if not self.fuse_combine or COMBINE_DEFECTS & self.source.defect_switches():
            return 0
        return fused_combine_counters(config, variant) if fuses_combine(config, variant) else 0

    def combine_scratch(self, config: AttentionConfig, variant: Variant) -> dict[str, tuple[int, np.dtype, bool]]:
        """The device buffers a call needs beside its inputs and outputs, by launch_plan's names:
        (elements, dtype, whether zeroed). The fused combine's counters and, with two levels,
        its group partials; none where the combine kernel runs. Every caller that builds a
        launch_plan's buffers (run below, bench/kernels.py) allocates from here."""
        counters = self.combine_counters(config, variant)
        if not counters:
            return {}
        scratch = {"combine_count": (counters, np.dtype(np.int32), True)}
        part_floats = fused_combine_part_floats(config)
        if part_floats:
            scratch["combine_part"] = (part_floats, np.dtype(np.float32), False)
        return scratch

    def cache_key_fields(self, variant: Variant, options: list[str]) -> dict[str, Any]:
        return {
            "variant": variant.name,
            "name_expressions": list(variant.name_expressions),
            "source_hash": self.source.hash,
            "options": options,
            "arch": self.arch,
            "compiler": self.compiler_version(),
            "backend": self.name,
        }

    def prepare(self, config: AttentionConfig) -> Prepared:
        variant = self.variant_for(config)
        loaded = self._loaded.get(variant.name)
        if loaded is not None and self.cache.enabled:
            return Prepared(variant.name, variant.block_n, self.source.hash, 0.0, True, loaded)
        self._rt_activate()
        options = self.compile_options(variant)
        result = self.cache.load_or_compile(
            variant.name, self.cache_key_fields(variant, options),
            lambda: self._rt_compile(variant, options))
        compiled = result.compiled
        module = self._rt_load(compiled)
        functions = {
            "fwd": self._rt_get_function(module, compiled.lowered_names[variant.fwd_expr]),
            "combine": self._rt_get_function(module, compiled.lowered_names[variant.combine_expr]),
        }
        self._rt_allow_shared(functions["fwd"], variant.shared_bytes)
        loaded = LoadedVariant(variant, module, functions)
        self._loaded[variant.name] = loaded
        return Prepared(variant.name, variant.block_n, self.source.hash, result.compile_s, result.hit, loaded)

    # -- run ------------------------------------------------------------------------------------
    def partial_bytes(self, config: AttentionConfig) -> int:
        """Bytes this backend allocates for the split-KV partials (== splitkv_extra_bytes)."""
        if config.split_kv == 1:
            return 0
        rows = config.split_kv * config.g * config.num_heads_q * config.seq_len_q
        return rows * config.head_dim_v * 4 + rows * 4

    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        loaded: LoadedVariant = prepared.handle
        if loaded is None or loaded.variant.name != prepared.variant:
            raise ValueError(f"prepared handle does not hold variant {prepared.variant}")
        c = config
        variant = loaded.variant
        dt = storage_dtypes(c.dtype)
        self._rt_activate()

        host: dict[str, np.ndarray] = {
            "q": to_physical(np.asarray(inputs["q"], dtype=dt["qk"]), c.trans_q),
            "k": to_physical(np.asarray(inputs["k"], dtype=dt["qk"]), c.trans_k),
            "v": to_physical(np.asarray(inputs["v"], dtype=dt["v"]), c.trans_v),
        }
        if c.with_attn_bias:
            host["bias"] = np.ascontiguousarray(np.asarray(inputs["bias"], dtype=dt["v"]))
        if c.causal and c.prefix_offset is not None:
            host["prefix_offset"] = np.asarray(c.prefix_offset, dtype=np.int32)
        if c.current_seq_len is not None:
            host["current_seq_len"] = np.asarray(c.current_seq_len, dtype=np.int32)

        outputs = output_buffers(c)
        part_bytes = sum(int(np.prod(outputs[k][0])) * 4 for k in ("o_part", "lse_part") if k in outputs)
        expected = splitkv_extra_bytes(c)
        if part_bytes != expected or part_bytes != self.partial_bytes(c):
            raise AssertionError(f"partial buffers {part_bytes} B != splitkv_extra_bytes {expected} B")

        buf: dict[str, int] = {}
        allocs: list[int] = []
        guard = self.guard_bytes
        events: tuple[Any, Any] | None = None
        try:
            t0 = time.perf_counter()
            for name, arr in host.items():
                base = self._rt_malloc(padded_bytes(max(arr.nbytes, 1), guard))
                allocs.append(base)
                if guard:   # NaN (or the largest integer) around it: see kernels/guards.py
                    size, pattern = fill_value_bits(arr.dtype)
                    self._rt_memset(base, size, pattern, padded_bytes(max(arr.nbytes, 1), guard) // size)
                buf[name] = base + guard
                self._rt_htod(buf[name], arr)
            for name, (shape, dtype) in outputs.items():
                count = int(np.prod(shape))
                base = self._rt_malloc(padded_bytes(count * dtype.itemsize, guard))
                allocs.append(base)
                if guard:
                    self._rt_memset(base, 1, CANARY, padded_bytes(count * dtype.itemsize, guard))
                buf[name] = base + guard
                size, pattern = nan_fill_pattern(dtype)
                self._rt_memset(buf[name], size, pattern, count)
            self.last_alloc = {k: int(np.prod(s)) * d.itemsize for k, (s, d) in outputs.items()}
            scratch = self.combine_scratch(c, variant)
            for name, (count, dtype, zeroed) in scratch.items():
                buf[name] = self._rt_malloc(count * dtype.itemsize)
                allocs.append(buf[name])
                if zeroed:
                    self._rt_memset(buf[name], dtype.itemsize, 0, count)
            counters = scratch["combine_count"][0] if scratch else 0
            transfer_s = time.perf_counter() - t0

            launches = launch_plan(c, variant, buf, quant_scale=float(inputs.get("quant_scale", 1.0)),
                                   quant_zero_point=int(inputs.get("quant_zero_point", 0)))
            events = self._rt_event_pair()
            self._rt_record(events[0])
            for launch in launches:
                self._rt_launch(loaded.functions[launch.kernel], launch)
            self._rt_record(events[1])
            run_s = self._rt_elapsed_s(*events)
            if counters:   # the last block of every row tile must have combined and re-armed
                counts = np.empty(counters, dtype=np.int32)
                self._rt_dtoh(counts, buf["combine_count"])
                if counts.any():
                    raise LaunchError(f"fused combine: {int((counts != 0).sum())} of {counters} counters left "
                                      "armed (no block saw itself last)")

            t1 = time.perf_counter()
            got = {}
            violations = []
            for name, (shape, dtype) in outputs.items():
                nbytes = int(np.prod(shape)) * dtype.itemsize
                raw = np.empty(padded_bytes(nbytes, guard), dtype=np.uint8)
                self._rt_dtoh(raw, buf[name] - guard)   # the output and its guards in one copy
                violation = check_guards(name, raw, nbytes, dtype.itemsize, guard)
                if violation is not None:
                    writers = [variant.kernel_function(k) for k in kernels_given(launches, buf[name])]
                    violations.append(violation.describe(writers))
                got[name] = raw[guard:guard + nbytes].view(dtype).reshape(shape)
            transfer_s += time.perf_counter() - t1
            if violations:
                raise DeviceFault("; ".join(violations), poisons=False)
        finally:
            if events is not None:
                for ev in events:
                    self._safe(self._rt_event_destroy, ev)
            for dptr in allocs:
                self._safe(self._rt_free, dptr)

        return RunOutput(
            out=to_logical(got["o"], c.trans_o),
            lse=got.get("lse"),
            o_partials=got.get("o_part"),
            lse_partials=got.get("lse_part"),
            run_s=run_s,
            transfer_s=transfer_s,
        )

    @staticmethod
    def _safe(fn: Any, *args: Any) -> None:
        """Cleanup must not hide the error that got us here (a sticky launch error, say)."""
        try:
            fn(*args)
        except (LaunchError, DeviceOutOfMemory, DeviceFault):
            pass
