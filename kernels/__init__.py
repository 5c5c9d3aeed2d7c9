"""Kernel backends (cpu emulation, CUDA, HIP, hostemu), their variants and the compile cache.

Importing this package imports no GPU runtime: kernels.cuda and kernels.hip (and through them
cuda-python and hip-python) load only when get_backend chooses them.
"""
from kernels.backend import (
    DEFECTS,
    Backend,
    BackendUnavailable,
    CompileError,
    DeviceFault,
    DeviceInfo,
    DeviceOutOfMemory,
    LaunchError,
    NotApplicable,
    Prepared,
    RunOutput,
)
from kernels.select import BACKEND_NAMES, get_backend

__all__ = [
    "BACKEND_NAMES",
    "DEFECTS",
    "Backend",
    "BackendUnavailable",
    "CompileError",
    "DeviceFault",
    "DeviceInfo",
    "DeviceOutOfMemory",
    "LaunchError",
    "NotApplicable",
    "Prepared",
    "RunOutput",
    "get_backend",
]
