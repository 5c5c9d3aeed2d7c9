"""The HIP backend: hiprtc + the HIP module API through hip-python (`from hip import hip, hiprtc`).

Imported lazily: `import kernels` never imports this module, and this module imports
hip-python only when a HipBackend is constructed. hip-python imports without ROCm and fails at
the first call that needs libamdhip64.so; both cases raise BackendUnavailable("no ROCm runtime
found: ..."). Every hip-python call returns a tuple whose first item is the error code.

Everything but the runtime calls (variants, cache, buffers, NaN prefill, launch plan, timing,
copy-out) is shared with the CUDA backend in kernels.backends.device.DeviceBackend, and the
compile calls with NVRTC's in kernels.backends.rtc. hiprtc compiles
the same attention.hip with `--offload-arch=<gcnArchName>`; its HIP headers are built in.

Written against hip-python's documented API (ROCm/hip-python examples: hiprtc_launch_kernel_args.py)
and not run on an AMD GPU; kernels/hipgate.py compiles every variant it would pick with hipcc.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from kernels.backends.base import BackendUnavailable, DeviceInfo, LaunchError
from kernels.backends.device import DeviceBackend
from kernels.backends.rtc import RuntimeCompiler, runtime_error, unpack
from kernels.cache import Compiled
from kernels.launch import Launch
from kernels.select import Variant
from kernels.source import KernelSource


def _import_hip() -> tuple[Any, Any]:
    try:
        from hip import hip, hiprtc
    except ImportError as exc:
        raise BackendUnavailable(f"no ROCm runtime found: hip-python is not installed ({exc})") from None
    return hip, hiprtc


# Errors a kernel leaves in its context (HIP's names for CUDA's sticky errors): every later call
# of the process fails with them, so the process must be replaced.
STICKY_ERRORS = frozenset({
    "hipErrorIllegalAddress", "hipErrorLaunchFailure", "hipErrorAssert", "hipErrorIllegalState",
    "hipErrorMisalignedAddress", "hipErrorInvalidAddressSpace", "hipErrorIllegalInstruction",
    "hipErrorHardwareStackError", "hipErrorInvalidPc", "hipErrorLaunchTimeOut", "hipErrorECCNotCorrectable",
})


def hip_compile_options(arch: str, variant: Variant) -> list[str]:
    """What hiprtc gets for `variant` on `arch` (gfx90a, gfx1100...); kernels/hipgate.py hands
    hipcc the same options, so the AMD compile gate compiles what would run."""
    return [f"--offload-arch={arch}", "-std=c++17", "-O3", *variant.macro_options()]


class HipBackend(DeviceBackend):
    name = "hip"

    def __init__(self, defects: frozenset[str] = frozenset(), *, device: int = 0, cache: Any = None,
                 source: KernelSource | None = None):
        super().__init__(defects, cache=cache)
        self.kernel_source = source  # None: the local kernels/src
        self._hip, rtc = _import_hip()
        self._device = device
        h = self._hip
        try:
            err, count = h.hipGetDeviceCount()
        except Exception as exc:  # hip-python raises RuntimeError when libamdhip64.so cannot be loaded
            raise BackendUnavailable(f"no ROCm runtime found: {exc}") from None
        if err != h.hipError_t.hipSuccess or count <= device:
            raise BackendUnavailable(f"no ROCm runtime found: hipGetDeviceCount -> {err}, {count} device(s)")
        self._rtc = RuntimeCompiler(rtc, "hiprtc", rtc.hiprtcResult.HIPRTC_SUCCESS, "Code", bytearray, "hiprtc")
        self._rt_activate()
        props = h.hipDeviceProp_t()
        self._check(h.hipGetDeviceProperties(props, device), "hipGetDeviceProperties")
        arch = props.gcnArchName
        self.arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        name = props.name
        self._device_name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        self._total_mem = int(props.totalGlobalMem)
        self._multiprocessors = int(props.multiProcessorCount)

    # -- error handling -------------------------------------------------------------------------
    def _check(self, result: tuple, what: str, exc: type[Exception] = LaunchError) -> Any:
        h = self._hip
        err, rest = result[0], result[1:]
        if isinstance(err, h.hipError_t) and err != h.hipError_t.hipSuccess:
            raise runtime_error(self, err, what, str(err), out_of_memory=err == h.hipError_t.hipErrorOutOfMemory,
                                sticky=STICKY_ERRORS, exc=exc)
        return unpack(rest)

    # -- device info ----------------------------------------------------------------------------
    def compiler_version(self) -> str:
        return self._rtc.version()

    def device_count(self) -> int:
        return int(self._check(self._hip.hipGetDeviceCount(), "hipGetDeviceCount"))

    def device_info(self) -> DeviceInfo:
        drv = self._check(self._hip.hipDriverGetVersion(), "hipDriverGetVersion")
        return DeviceInfo(backend="hip", device=self._device_name, total_memory=self._total_mem,
                          driver_version=str(drv), compiler_version=self.compiler_version(), arch=self.arch,
                          multiprocessors=self._multiprocessors)

    # -- compile and load -----------------------------------------------------------------------
    def compile_options(self, variant: Variant) -> list[str]:
        return hip_compile_options(self.arch, variant)

    def _rt_compile(self, variant: Variant, options: list[str]) -> Compiled:
        return self._rtc.compile(self.source, variant, options)

    def _rt_load(self, compiled: Compiled) -> Any:
        return self._check(self._hip.hipModuleLoadData(bytearray(compiled.binary)), "hipModuleLoadData")

    def _rt_get_function(self, module: Any, lowered_name: str) -> Any:
        return self._check(self._hip.hipModuleGetFunction(module, lowered_name.encode()), "hipModuleGetFunction")

    # -- memory ---------------------------------------------------------------------------------
    def _rt_activate(self) -> None:
        self._check(self._hip.hipSetDevice(self._device), "hipSetDevice")

    def _rt_malloc(self, nbytes: int) -> int:
        return int(self._check(self._hip.hipMalloc(nbytes), f"hipMalloc({nbytes})"))

    def _rt_free(self, dptr: int) -> None:
        self._check(self._hip.hipFree(ctypes.c_void_p(dptr)), "hipFree")

    def _rt_htod(self, dptr: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        h = self._hip
        self._check(h.hipMemcpy(ctypes.c_void_p(dptr), ctypes.c_void_p(host.ctypes.data), host.nbytes,
                                h.hipMemcpyKind.hipMemcpyHostToDevice), "hipMemcpy(HtoD)")

    def _rt_dtoh(self, host: np.ndarray, dptr: int) -> None:
        assert host.flags.c_contiguous
        h = self._hip
        self._check(h.hipMemcpy(ctypes.c_void_p(host.ctypes.data), ctypes.c_void_p(dptr), host.nbytes,
                                h.hipMemcpyKind.hipMemcpyDeviceToHost), "hipMemcpy(DtoH)")

    def _rt_memset(self, dptr: int, elem_size: int, pattern: int, count: int) -> None:
        h = self._hip
        if elem_size == 4:
            self._check(h.hipMemsetD32(ctypes.c_void_p(dptr), pattern, count), "hipMemsetD32")
        elif elem_size == 2:
            self._check(h.hipMemsetD16(ctypes.c_void_p(dptr), pattern, count), "hipMemsetD16")
        elif elem_size == 1:
            self._check(h.hipMemsetD8(ctypes.c_void_p(dptr), pattern, count), "hipMemsetD8")
        else:
            raise ValueError(f"memset of {elem_size}-byte elements")

    # -- launch and time ------------------------------------------------------------------------
    def _rt_launch(self, function: Any, launch: Launch) -> None:
        # hip-python packs a tuple of ctypes objects in `extra` with the kernel's alignment rules.
        extra = tuple(a.as_ctypes() for a in launch.args)
        self._check(self._hip.hipModuleLaunchKernel(
            function, *launch.grid, *launch.block, sharedMemBytes=launch.shared_bytes, stream=None,
            kernelParams=None, extra=extra), f"hipModuleLaunchKernel({launch.kernel})")

    def _rt_event_pair(self) -> tuple[Any, Any]:
        h = self._hip
        return (self._check(h.hipEventCreate(), "hipEventCreate"),
                self._check(h.hipEventCreate(), "hipEventCreate"))

    def _rt_record(self, event: Any) -> None:
        self._check(self._hip.hipEventRecord(event, None), "hipEventRecord")

    def _rt_elapsed_s(self, start: Any, stop: Any) -> float:
        h = self._hip
        self._check(h.hipEventSynchronize(stop), "kernel execution (hipEventSynchronize)")
        self._check(h.hipDeviceSynchronize(), "kernel execution (hipDeviceSynchronize)")
        ms = self._check(h.hipEventElapsedTime(start, stop), "hipEventElapsedTime")
        return float(ms) / 1000.0

    def _rt_event_destroy(self, event: Any) -> None:
        self._check(self._hip.hipEventDestroy(event), "hipEventDestroy")

    def close(self) -> None:
        for lv in self._loaded.values():
            try:
                self._hip.hipModuleUnload(lv.module)
            except Exception:
                pass
        self._loaded.clear()
