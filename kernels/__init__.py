"""The split-KV attention kernels: variant selection (select.py), the measured tables
(tuning.py), launch plans (launch.py), the compile cache (cache.py) and the backends that
compile and run them (backends/: cpu emulation, CUDA, HIP, hostemu).

Importing this package imports no GPU runtime: kernels.backends.cuda and kernels.backends.hip
(and through them cuda-python and hip-python) load only when get_backend chooses them.
"""
from kernels.backends import BACKEND_NAMES, get_backend
from kernels.backends.base import (
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
