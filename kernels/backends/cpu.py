"""The `cpu` backend: the split-KV kernels emulated in numpy, for machines without a GPU.

It runs the kernels' algorithm, not the reference's: the same block_n tiles, split
boundaries and guards (reference/splits.py, shared with the reference so there is one copy
of the arithmetic), P rounded to the storage type before P·V as tensor-core kernels do, f32
partials in NaN-filled buffers, and the unmasked combine of a device combine kernel. The
defect switches of DEFECTS act on that shared code, so a sweep on this backend shows each
bug class with its real symptom.

Source revisions: the emulation's arithmetic is Python, so a kernel source (a bundle of
kernels/src at some commit, or the local one) reaches it only through its defect switches:
the `#define ATTN_DEFECT_*` lines of the source (kernels.source.KernelSource.defect_switches)
are added to the defects asked for. With a bundle, results carry the bundle's hash, since the
revision is what was tested; without one, the hash of the emulation's own modules.
"""
from __future__ import annotations

import hashlib
import platform
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig, parse_config
from kernels.backends.base import DEFECTS, GPU_ONLY_DEFECTS, Backend, DeviceFault, DeviceInfo, Prepared, RunOutput
from kernels.guards import CANARY, GUARD_BYTES, check_guards, padded_bytes
from kernels.select import COMBINE_KERNEL, SPLIT_KERNEL
from kernels.source import KernelSource, local_source
from reference import chunks, masks, splits
from reference.inputs import output_dtypes, value_dtype
from reference.layout import logical_view, to_logical, to_physical

DEFAULT_BLOCK_N = 32


def _source_hash() -> str:
    """Identity of the emulated kernel: the source of every module its arithmetic runs through."""
    digest = hashlib.sha256()
    for module_file in (splits.__file__, masks.__file__, chunks.__file__, __file__):
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:16]


def _source_switches(source: KernelSource | None) -> frozenset[str]:
    if source is None:
        source = local_source()
    return source.defect_switches()


class CpuEmulationBackend(Backend):
    name = "cpu"

    def __init__(self, defects: frozenset[str] = frozenset(), block_n: int = DEFAULT_BLOCK_N,
                 source: KernelSource | None = None):
        switches = _source_switches(source)
        gpu_only = sorted(GPU_ONLY_DEFECTS & set(defects))
        if gpu_only:
            raise ValueError(f"defects: {', '.join(gpu_only)} is a race between GPU threads, which the cpu "
                             "emulation does not run; use a GPU backend (with --sanitize racecheck)")
        super().__init__(frozenset(defects) | (switches & (DEFECTS.keys() - GPU_ONLY_DEFECTS)))
        if block_n < 1:
            raise ValueError(f"block_n={block_n} must be >= 1")
        self.block_n = block_n
        self.kernel_source = source
        # Switches of the source that the emulation has no model of: it runs without them.
        self.unemulated_switches = switches - self.defects
        self._source_hash = source.hash if source is not None else _source_hash()

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(
            backend="cpu",
            device="cpu (numpy emulation of the split-KV kernels; no GPU)",
            total_memory=None,
            compiler_version=f"numpy {np.__version__}",
            arch=platform.machine(),
        )

    def variant_name(self, c: AttentionConfig) -> str:
        """Deterministic name from the parameters a GPU build would compile in."""
        name = f"cpu_attn_{c.dtype}_bn{self.block_n}_dqk{c.head_dim_qk}_dv{c.head_dim_v}"
        if self.defects:
            name += "_defects-" + "-".join(sorted(self.defects))
        return name

    def _refuse_if_poisoned(self) -> None:
        if self.poisoned:
            raise DeviceFault("the emulated context is unusable after an earlier config's emulated device "
                              "fault (oob_store), as a GPU context is after a sticky error", poisons=True)

    def prepare(self, config: AttentionConfig) -> Prepared:
        self._refuse_if_poisoned()
        c = parse_config(config)
        return Prepared(variant=self.variant_name(c), block_n=self.block_n, source_hash=self._source_hash)

    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        self._refuse_if_poisoned()
        c = parse_config(config)
        started = time.perf_counter()
        block_n = prepared.block_n
        # Copy in: the "device" holds physical layouts and the kernel addresses them logically.
        device = {
            "q": logical_view(to_physical(inputs["q"], c.trans_q), c.trans_q),
            "k": logical_view(to_physical(inputs["k"], c.trans_k), c.trans_k),
            "v": logical_view(to_physical(inputs["v"], c.trans_v), c.trans_v),
        }
        for key in ("bias", "quant_scale", "quant_zero_point"):
            if key in inputs:
                device[key] = inputs[key]

        out_dtype, lse_dtype = output_dtypes(c)
        o_shape = (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v)
        o_physical = o_shape[:2] + (o_shape[3], o_shape[2]) if c.trans_o else o_shape
        # O inside guard zones (kernels/guards.py), as the GPU backends allocate it.
        o_bytes = int(np.prod(o_physical)) * np.dtype(out_dtype).itemsize
        o_raw = np.full(padded_bytes(o_bytes), CANARY, dtype=np.uint8)
        o_buffer = o_raw[GUARD_BYTES:GUARD_BYTES + o_bytes].view(out_dtype).reshape(o_physical)
        o_buffer[...] = np.nan
        lse_buffer = np.full(o_shape[:3], np.nan, dtype=lse_dtype) if c.return_lse else None
        # f16 and bf16 kernels round P to the storage type for the tensor-core P·V; i8 to f16.
        p_dtype = None if c.dtype == "f32" else value_dtype(c.dtype)

        S = c.split_kv
        partial_shape = (S,) + o_shape
        o_partials = np.full(partial_shape, np.nan, dtype=np.float32)
        lse_partials = np.full(partial_shape[:-1], np.nan, dtype=np.float32)
        splits.split_partials(c, device, block_n, self.defects, p_dtype, o_partials, lse_partials)
        if S == 1:
            # No partial buffers on the device: the one split writes the final output directly.
            out_f32, lse_f32 = o_partials[0], lse_partials[0]
        else:
            try:
                out_f32, lse_f32 = splits.combine_unmasked(o_partials, lse_partials, self.defects)
                self._combine_defects(out_f32, o_raw, o_bytes, np.dtype(out_dtype))
            except BaseException as exc:
                # A time limit that stops the emulation here stopped the combine kernel: the
                # note says so in the timeout's detail (isolation.executor, triage.attempt).
                exc.add_note(f"stopped in {COMBINE_KERNEL} (cpu emulation)")
                raise
        logical_view(o_buffer, c.trans_o)[...] = out_f32.astype(out_dtype)
        violation = check_guards("o", o_raw, o_bytes, np.dtype(out_dtype).itemsize)
        if violation is not None:
            # O's one writer, as on a GPU: the combine when there are partials, else the split kernel.
            raise DeviceFault(violation.describe([COMBINE_KERNEL if S > 1 else SPLIT_KERNEL]), poisons=False)
        if lse_buffer is not None:
            lse_buffer[...] = lse_f32.astype(lse_dtype)
        run_s = time.perf_counter() - started
        return RunOutput(
            out=to_logical(o_buffer, c.trans_o),
            lse=lse_buffer,
            o_partials=o_partials if S > 1 else None,
            lse_partials=lse_partials if S > 1 else None,
            run_s=run_s,
        )

    def _combine_defects(self, out_f32: np.ndarray, o_raw: np.ndarray, o_bytes: int, out_dtype: np.dtype) -> None:
        """The combine kernel's fault defects as the emulation models them: the illegal store as
        a fault that leaves the emulated context unusable, the small one as a store 2 elements
        past O into its guard zone, the hang as a loop the per-config time limit ends."""
        if "oob_store" in self.defects:
            self.poisoned = True
            raise DeviceFault(f"{COMBINE_KERNEL}: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was "
                              "encountered (cpu emulation of the oob_store defect)", poisons=True)
        if "oob_store_small" in self.defects:
            at = GUARD_BYTES + o_bytes + out_dtype.itemsize   # element count + 1
            o_raw[at:at + out_dtype.itemsize] = np.frombuffer(
                np.asarray(out_f32.flat[-1], dtype=out_dtype).tobytes(), dtype=np.uint8)
        if "hang" in self.defects:
            while True:
                time.sleep(0.05)
