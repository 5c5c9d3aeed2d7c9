"""The `hostemu` backend: the real kernel source (kernels/src/attention.hip, or a commit's bundle)
compiled with the host's C++ compiler under -DATTN_HOST_EMULATION and run on the CPU.

hip_compat.h's host-emulation branch (host_emu.h) turns a thread block into NT std::threads
that walk the grid block by block, `__shared__` into statics and `__syncthreads` into a
barrier. The kernels then run through the very `DeviceBackend.run` the GPU backends use:
variant selection, launch plans, buffers and their guard zones, NaN prefill, argument packing,
the combine. Its outputs are what the source computes (not a model of it, as the `cpu`
backend's numpy emulation is), so a change to the source's arithmetic that no defect switch
describes shows here and not on `cpu`.

The binaries (shared libraries) are cached like the GPU backends' (kernels/cache.py), keyed by
the source hash, host_emu.h's text, the options and the compiler's version. The variants are
the portable ones (rowwise and grouped) a GPU without NVIDIA's tensor cores runs: the mma path
is the NVIDIA-only one (`mma=True` emulates its instructions too, for the tests).

It is slow (one block at a time; every barrier and shuffle wakes the block's threads): configs
whose emulated work passes the hostemu_max_work setting (query rows x keys x head dims, summed
over the splits' reach) or hostemu_max_blocks thread blocks are refused as
NotApplicable("hostemu_too_large"); a sweep on hostemu samples smaller
ranges (README, "Which backend"). Fault defects behave as on a host: `oob_store` writes 1 TiB
past O and kills the process (the worker pool replaces it; three deaths store `error`), `hang`
spins until the per-config time limit.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from attnconfig import AttentionConfig
from settings import get_settings
from kernels.backends.base import BackendUnavailable, CompileError, DeviceInfo, NotApplicable, Prepared
from kernels.backends.device import DeviceBackend
from kernels.cache import Compiled
from kernels.launch import Launch, pack_kernel_params
from kernels.select import Variant
from kernels.source import SRC_DIR, KernelSource

HOST_EMU_HEADER = "host_emu.h"
HOST_EMU_MAX_SHARED = 232448   # host_emu.h's attn_mma_smem (sm_90's opt-in maximum)



def host_compiler() -> str | None:
    """The C++20 compiler: $CXX, else g++, else clang++ (None: none on PATH)."""
    for cand in (os.environ.get("CXX"), "g++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def emulated_work(config: AttentionConfig) -> int:
    """Multiply-adds the emulated kernels perform, about: every query row against every key
    (each split reaches its own keys only, so the splits add up to one pass), both head dims."""
    c = config
    return c.g * c.num_heads_q * c.seq_len_q * c.seq_len_k * (c.head_dim_qk + c.head_dim_v)


def emulated_blocks(config: AttentionConfig) -> int:
    """Thread blocks of the forward launch at most (the rowwise path's grid: one a row and split)."""
    return config.g * config.num_heads_q * config.seq_len_q * config.split_kv


class HostEmuBackend(DeviceBackend):
    """DeviceBackend whose 'device' is host memory and whose compiler is the host's C++ compiler."""

    name = "hostemu"
    arch = "host"
    waits_on_device = False   # the kernels run on this host's CPU: nothing to overlap with

    def __init__(self, defects: frozenset[str] = frozenset(), *, cache: Any = None,
                 source: KernelSource | None = None, mma: bool = False, limits: bool = True):
        cxx = host_compiler()
        if cxx is None:
            raise BackendUnavailable("hostemu needs a C++20 compiler (g++ or clang++, or $CXX); none found")
        super().__init__(frozenset(defects), cache=cache)
        self.kernel_source = source   # None: the local kernels/src
        self.cxx = cxx
        self.mma_capable = mma        # the tensor-core kernel, its NVIDIA instructions emulated (host_emu.h)
        self.limits = limits          # False: run any config however long it takes (tests)
        self._mem: dict[int, np.ndarray] = {}
        self._tmp = Path(tempfile.mkdtemp(prefix="attn-hostemu-"))
        self._version: str | None = None
        self._lock = threading.Lock()

    # -- device info ----------------------------------------------------------------------------
    def compiler_version(self) -> str:
        if self._version is None:
            out = subprocess.run([self.cxx, "--version"], capture_output=True, text=True).stdout
            self._version = out.splitlines()[0].strip() if out else Path(self.cxx).name
        return self._version

    def device_info(self) -> DeviceInfo:
        return DeviceInfo("hostemu", f"host emulation of attention.hip ({os.cpu_count()} cores)", None, "",
                          self.compiler_version(), "host")

    # -- the source the compiler reads ------------------------------------------------------------
    def host_emu_text(self) -> str:
        """host_emu.h: the bundle's own where it has one, else the local kernels/src's (the header
        is not part of the GPU compile, so a bundle of an older commit may lack it)."""
        src = self.source
        if HOST_EMU_HEADER in src.headers:
            return src.headers[HOST_EMU_HEADER]
        return (SRC_DIR / HOST_EMU_HEADER).read_text()

    def cache_key_fields(self, variant: Variant, options: list[str]) -> dict[str, Any]:
        fields = super().cache_key_fields(variant, options)
        fields["host_emu_h"] = hashlib.sha256(self.host_emu_text().encode()).hexdigest()
        return fields

    def _source_dir(self) -> Path:
        """The source's files written out once per source hash (what `-I` and the entry read)."""
        src = self.source
        d = self._tmp / f"src-{src.hash[:16]}"
        with self._lock:
            self._tmp.mkdir(parents=True, exist_ok=True)   # close() removes it
            if not d.is_dir():
                part = self._tmp / f".part-{src.hash[:16]}-{threading.get_ident()}"
                part.mkdir()
                for name, text in {**src.files, HOST_EMU_HEADER: self.host_emu_text()}.items():
                    (part / name).write_text(text)
                part.rename(d)
        return d

    # -- compile and load -----------------------------------------------------------------------
    def compile_options(self, variant: Variant) -> list[str]:
        return ["-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-DATTN_HOST_EMULATION",
                *variant.macro_options()]

    def _rt_compile(self, variant: Variant, options: list[str]) -> Compiled:
        src_dir = self._source_dir()
        entry = self._tmp / f"{variant.name}-{os.getpid()}-{threading.get_ident()}.cpp"
        entry.write_text(
            f'#include "{self.source.entry_name}"\n'
            'extern "C" void emu_launch(int which, void** p, unsigned gx, unsigned gy, unsigned gz, unsigned nt,\n'
            '                           unsigned shared) {\n'
            f'  if (which == 0) attn_emu_launch(&{variant.fwd_expr}, p, gx, gy, gz, nt, shared);\n'
            f'  else attn_emu_launch(&{variant.combine_expr}, p, gx, gy, gz, nt, shared);\n'
            '}\n')
        out = entry.with_suffix(".so")
        try:
            proc = subprocess.run([self.cxx, *options, "-I", str(src_dir), "-x", "c++", str(entry), "-o", str(out)],
                                  capture_output=True, text=True)
            if proc.returncode:
                raise CompileError(f"{Path(self.cxx).name} failed on {variant.name}", log=proc.stderr)
            return Compiled(out.read_bytes(), {variant.fwd_expr: "0", variant.combine_expr: "1"}, proc.stderr)
        finally:
            entry.unlink(missing_ok=True)
            out.unlink(missing_ok=True)

    def _rt_load(self, compiled: Compiled) -> Any:
        self._tmp.mkdir(parents=True, exist_ok=True)
        path = self._tmp / f"mod-{hashlib.sha1(compiled.binary).hexdigest()}.so"
        if not path.exists():   # never rewrite a library that may be mapped already
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(compiled.binary)
            os.replace(tmp, path)
        lib = ctypes.CDLL(str(path))
        lib.emu_launch.argtypes = [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_uint] * 5
        return lib

    def _rt_get_function(self, module: Any, lowered_name: str) -> Any:
        return (module, int(lowered_name))

    def _rt_allow_shared(self, function: Any, nbytes: int) -> None:
        if nbytes > HOST_EMU_MAX_SHARED:
            raise NotImplementedError(f"hostemu: {nbytes} B of dynamic shared memory > {HOST_EMU_MAX_SHARED}")

    # -- prepare: refuse what would take too long -------------------------------------------------
    def prepare(self, config: AttentionConfig) -> Prepared:
        if self.limits:
            settings = get_settings()
            work, blocks = emulated_work(config), emulated_blocks(config)
            if work > settings.hostemu_max_work:
                raise NotApplicable("hostemu_too_large", f"{work} emulated multiply-adds > {settings.hostemu_max_work} "
                                    "(ATTNSWEEP_HOSTEMU_MAX_WORK)")
            if blocks > settings.hostemu_max_blocks:
                raise NotApplicable("hostemu_too_large", f"{blocks} thread blocks > {settings.hostemu_max_blocks} "
                                    "(ATTNSWEEP_HOSTEMU_MAX_BLOCKS)")
        return super().prepare(config)

    # -- memory: host arrays, 64-byte aligned ------------------------------------------------------
    def _rt_activate(self) -> None:
        pass

    def _rt_malloc(self, nbytes: int) -> int:
        arr = np.empty(nbytes + 64, dtype=np.uint8)
        addr = (arr.ctypes.data + 63) // 64 * 64
        self._mem[addr] = arr
        return addr

    def _rt_free(self, dptr: int) -> None:
        del self._mem[dptr]

    def _rt_htod(self, dptr: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        ctypes.memmove(dptr, host.ctypes.data, host.nbytes)

    def _rt_dtoh(self, host: np.ndarray, dptr: int) -> None:
        ctypes.memmove(host.ctypes.data, dptr, host.nbytes)

    def _rt_memset(self, dptr: int, elem_size: int, pattern: int, count: int) -> None:
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[elem_size]
        np.frombuffer((ctypes.c_char * (count * elem_size)).from_address(dptr), dtype=dtype)[:] = pattern

    # -- launch and time --------------------------------------------------------------------------
    def _rt_launch(self, function: Any, launch: Launch) -> None:
        lib, which = function
        params, keep = pack_kernel_params(launch.args)
        lib.emu_launch(which, ctypes.addressof(params), *launch.grid, launch.block[0], launch.shared_bytes)
        del keep

    def _rt_event_pair(self) -> tuple[Any, Any]:
        return [0.0], [0.0]

    def _rt_record(self, event: Any) -> None:
        event[0] = time.perf_counter()

    def _rt_elapsed_s(self, start: Any, stop: Any) -> float:
        return stop[0] - start[0]

    def _rt_event_destroy(self, event: Any) -> None:
        pass

    def _rt_malloc_total(self) -> int:
        return sum(a.nbytes for a in self._mem.values())

    def close(self) -> None:
        self._loaded.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)
