"""The CUDA backend: NVRTC + the driver API through cuda-python (`cuda.bindings`).

Imported lazily: `import kernels` never imports this module, and this module imports
cuda-python only when a CudaBackend is constructed. Every cuda.bindings call returns a tuple
whose first item is the error code; each one is checked (`_check`).

The HIP source compiles as CUDA through kernels/src/hip_compat.h; NVRTC gets
`-arch=sm_XX` and `--include-path=` the CUDA include folder (for cuda_fp16.h / cuda_bf16.h).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from settings import get_settings
from kernels.backends.base import BackendUnavailable, DeviceInfo, LaunchError
from kernels.backends.device import DeviceBackend
from kernels.backends.rtc import RuntimeCompiler, runtime_error, unpack
from kernels.cache import Compiled
from kernels.launch import DEFAULT_MAX_SHARED, Launch, pack_kernel_params
from kernels.select import Variant
from kernels.source import KernelSource


def _import_cuda() -> tuple[Any, Any]:
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:
        try:  # cuda-python < 12.6 spelled it cuda.cuda / cuda.nvrtc
            from cuda import cuda as driver  # type: ignore[no-redef]
            from cuda import nvrtc  # type: ignore[no-redef]
        except ImportError:
            raise BackendUnavailable(f"no CUDA runtime found: cuda-python is not installed ({exc})") from None
    return driver, nvrtc


def cuda_include_dir() -> str | None:
    """The folder holding cuda_fp16.h: the cuda_include setting (ATTNSWEEP_CUDA_INCLUDE),
    $CUDA_HOME, /usr/local/cuda, or pip's copy."""
    candidates = [get_settings().cuda_include]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    candidates.append("/usr/local/cuda/include")
    for c in candidates:
        if c and Path(c, "cuda_fp16.h").is_file():
            return c
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found and Path(found, "cuda_fp16.h").is_file():
            return str(found)
    except Exception:  # pathfinder missing or too old: fall through to the error below
        pass
    return None


# Errors a kernel leaves in its context: every later call of the process fails with them (the
# CUDA driver API's "persistent" errors). The config that launched it is a `fault`, and the
# process must be replaced.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_TENSOR_MEMORY_LEAK", "CUDA_ERROR_CONTEXT_IS_DESTROYED",
})


class CudaBackend(DeviceBackend):
    name = "cuda"

    def __init__(self, defects: frozenset[str] = frozenset(), *, device: int = 0, cache: Any = None,
                 source: KernelSource | None = None):
        super().__init__(defects, cache=cache)
        self.kernel_source = source  # None: the local kernels/src
        self._driver, self._nvrtc = _import_cuda()
        self._ctx = None
        d = self._driver
        try:
            err, = d.cuInit(0)
        except (RuntimeError, OSError) as exc:  # libcuda.so missing: cuda-python fails at the first call
            raise BackendUnavailable(f"no CUDA runtime found: {exc}") from None
        if err != d.CUresult.CUDA_SUCCESS:
            raise BackendUnavailable(f"no CUDA GPU usable: cuInit failed: {self._err_str(err)}")
        count = self._check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if count <= device:
            raise BackendUnavailable(f"no CUDA GPU usable: device {device} requested, {count} present")
        nv = self._nvrtc
        self._rtc = RuntimeCompiler(nv, "nvrtc", nv.nvrtcResult.NVRTC_SUCCESS, "CUBIN", lambda n: b" " * n, "NVRTC")
        self._dev = self._check(d.cuDeviceGet(device), "cuDeviceGet")
        self._ctx = self._check(d.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self._rt_activate()
        attr = d.CUdevice_attribute
        major = self._check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._dev), "cuDeviceGetAttribute")
        minor = self._check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._dev), "cuDeviceGetAttribute")
        self.arch = f"sm_{major}{minor}"
        # mma.sync m16n8k16 f16/bf16, ldmatrix, cp.async; the mma setting off (ATTNSWEEP_MMA=0)
        # runs the portable kernels only
        self.mma_capable = int(major) >= 8 and get_settings().mma
        self.multiprocessors = int(self._check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self._dev),
                                               "cuDeviceGetAttribute"))
        self.include_dir = cuda_include_dir()
        if self.include_dir is None:
            raise BackendUnavailable("no CUDA headers found (cuda_fp16.h): set ATTNSWEEP_CUDA_INCLUDE or CUDA_HOME")

    # -- error handling -------------------------------------------------------------------------
    def _err_str(self, err: Any) -> str:
        try:
            e2, s = self._driver.cuGetErrorString(err)
            if e2 == self._driver.CUresult.CUDA_SUCCESS and s:
                return f"{err.name if hasattr(err, 'name') else err}: {s.decode(errors='replace')}"
        except Exception:
            pass
        return str(err)

    def _check(self, result: tuple, what: str, exc: type[Exception] = LaunchError) -> Any:
        err, rest = result[0], result[1:]
        r = self._driver.CUresult
        if err != r.CUDA_SUCCESS:
            raise runtime_error(self, err, what, self._err_str(err), out_of_memory=err == r.CUDA_ERROR_OUT_OF_MEMORY,
                                sticky=STICKY_ERRORS, exc=exc)
        return unpack(rest)

    # -- device info ----------------------------------------------------------------------------
    def compiler_version(self) -> str:
        return self._rtc.version()

    def device_count(self) -> int:
        return int(self._check(self._driver.cuDeviceGetCount(), "cuDeviceGetCount"))

    def device_info(self) -> DeviceInfo:
        d = self._driver
        name = self._check(d.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        total = self._check(d.cuDeviceTotalMem(self._dev), "cuDeviceTotalMem")
        drv = self._check(d.cuDriverGetVersion(), "cuDriverGetVersion")
        return DeviceInfo(
            backend="cuda",
            device=name.split(b"\0", 1)[0].decode(errors="replace"),
            total_memory=int(total),
            driver_version=f"{drv // 1000}.{(drv % 1000) // 10}",
            compiler_version=self.compiler_version(),
            arch=self.arch,
            multiprocessors=self.multiprocessors,
        )

    # -- compile and load -----------------------------------------------------------------------
    def compile_options(self, variant: Variant) -> list[str]:
        return [f"-arch={self.arch}", "-std=c++17", f"--include-path={self.include_dir}",
                *variant.macro_options()]

    def _rt_compile(self, variant: Variant, options: list[str]) -> Compiled:
        return self._rtc.compile(self.source, variant, options)

    def _rt_load(self, compiled: Compiled) -> Any:
        image = np.frombuffer(compiled.binary, dtype=np.uint8).copy()
        return self._check(self._driver.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData")

    def _rt_get_function(self, module: Any, lowered_name: str) -> Any:
        return self._check(self._driver.cuModuleGetFunction(module, lowered_name.encode()), "cuModuleGetFunction")

    def _rt_allow_shared(self, function: Any, nbytes: int) -> None:
        if nbytes > DEFAULT_MAX_SHARED:
            d = self._driver
            self._check(d.cuFuncSetAttribute(
                function, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")

    # -- memory ---------------------------------------------------------------------------------
    def _rt_activate(self) -> None:
        if self._ctx is not None:
            self._check(self._driver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def _rt_malloc(self, nbytes: int) -> int:
        return int(self._check(self._driver.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))

    def _rt_free(self, dptr: int) -> None:
        self._check(self._driver.cuMemFree(dptr), "cuMemFree")

    def _rt_htod(self, dptr: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self._check(self._driver.cuMemcpyHtoD(dptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def _rt_dtoh(self, host: np.ndarray, dptr: int) -> None:
        assert host.flags.c_contiguous
        self._check(self._driver.cuMemcpyDtoH(host.ctypes.data, dptr, host.nbytes), "cuMemcpyDtoH")

    def _rt_memset(self, dptr: int, elem_size: int, pattern: int, count: int) -> None:
        d = self._driver
        if elem_size == 4:
            self._check(d.cuMemsetD32(dptr, pattern, count), "cuMemsetD32")
        elif elem_size == 2:
            self._check(d.cuMemsetD16(dptr, pattern, count), "cuMemsetD16")
        elif elem_size == 1:
            self._check(d.cuMemsetD8(dptr, pattern, count), "cuMemsetD8")
        else:
            raise ValueError(f"memset of {elem_size}-byte elements")

    # -- launch and time ------------------------------------------------------------------------
    def _rt_launch(self, function: Any, launch: Launch) -> None:
        self.launcher(function, launch)()

    def launcher(self, function: Any, launch: Launch) -> Callable[[], None]:
        """`launch` as a callable, its arguments packed once: a benchmark's timed loop then pays
        one driver call per launch, as a C++ caller would."""
        params, keep = pack_kernel_params(launch.args)
        call = (function, *launch.grid, *launch.block, launch.shared_bytes, 0, ctypes.addressof(params), 0)
        launch_kernel, what = self._driver.cuLaunchKernel, f"cuLaunchKernel({launch.kernel})"

        def run() -> None:
            self._check(launch_kernel(*call), what)

        run.keep = (params, keep)   # the packed arguments live as long as the callable
        return run

    def resident_blocks(self, prepared: Any) -> int:
        """Blocks of `prepared`'s split kernel one SM runs at once (the driver's occupancy)."""
        v = prepared.handle.variant
        return int(self._check(self._driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            prepared.handle.functions["fwd"], v.threads, v.shared_bytes), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))

    def _rt_event_pair(self) -> tuple[Any, Any]:
        d = self._driver
        start = self._check(d.cuEventCreate(0), "cuEventCreate")   # 0 = CU_EVENT_DEFAULT
        stop = self._check(d.cuEventCreate(0), "cuEventCreate")
        return start, stop

    def _rt_record(self, event: Any) -> None:
        self._check(self._driver.cuEventRecord(event, 0), "cuEventRecord")

    def _rt_elapsed_s(self, start: Any, stop: Any) -> float:
        d = self._driver
        self._check(d.cuEventSynchronize(stop), "kernel execution (cuEventSynchronize)")
        self._check(d.cuCtxSynchronize(), "kernel execution (cuCtxSynchronize)")
        ms = self._check(d.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
        return float(ms) / 1000.0

    def _rt_event_destroy(self, event: Any) -> None:
        self._check(self._driver.cuEventDestroy(event), "cuEventDestroy")

    def close(self) -> None:
        if self._ctx is None:
            return
        d = self._driver
        try:
            self._rt_activate()
            for lv in self._loaded.values():
                d.cuModuleUnload(lv.module)
        finally:
            self._loaded.clear()
            d.cuDevicePrimaryCtxRelease(self._dev)
            self._ctx = None
