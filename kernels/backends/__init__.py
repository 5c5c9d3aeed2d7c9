"""The kernel backends, and picking one by name: `auto` takes the first usable of cuda, hip, then
the cpu emulation; `hostemu` (hostemu.py) only when named.

base.py is the interface (and the defect switches), device.py the runtime-neutral GPU backend,
rtc.py the runtime compilers' adapter; cuda.py, hip.py, cpu.py and hostemu.py the backends.

Each runtime is imported only when its backend is tried, so choosing `cpu` never touches
cuda-python or hip-python, and `auto` on a machine without GPUs falls through quietly.
"""
from __future__ import annotations

from typing import Callable

from kernels.backends.base import Backend, BackendUnavailable
from kernels.source import KernelSource

BACKEND_NAMES = ("auto", "cpu", "cuda", "hip", "hostemu")
# hostemu (the real source on the CPU, slow) is chosen by name only: auto never picks it.
AUTO_ORDER = ("cuda", "hip", "cpu")


def _cuda(defects: frozenset[str], source: KernelSource | None = None) -> Backend:
    from kernels.backends.cuda import CudaBackend

    return CudaBackend(defects, source=source)


def _hip(defects: frozenset[str], source: KernelSource | None = None) -> Backend:
    from kernels.backends.hip import HipBackend

    return HipBackend(defects, source=source)


def _cpu(defects: frozenset[str], source: KernelSource | None = None) -> Backend:
    from kernels.backends.cpu import CpuEmulationBackend

    return CpuEmulationBackend(defects, source=source)


def _hostemu(defects: frozenset[str], source: KernelSource | None = None) -> Backend:
    from kernels.backends.hostemu import HostEmuBackend

    return HostEmuBackend(defects, source=source)


FACTORIES: dict[str, Callable[..., Backend]] = {"cuda": _cuda, "hip": _hip, "cpu": _cpu, "hostemu": _hostemu}


def _make(factory: Callable[..., Backend], defects: frozenset[str], source: KernelSource | None) -> Backend:
    # A factory may take the defects alone (a stand-in, say) as long as no bundle is asked for.
    return factory(defects) if source is None else factory(defects, source)


def get_backend(name: str = "auto", defects: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
                source: KernelSource | None = None) -> Backend:
    """The backend called `name` ("auto", "cpu", "cuda", "hip", "hostemu") compiled with `defects`, from
    `source` (a bundle of kernels/src at some revision; None: the local kernels/src).

    Raises BackendUnavailable when a named GPU backend cannot run here (auto never does: it
    falls back to cpu), ValueError for an unknown name or defect."""
    defects = frozenset(defects)
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend: unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name != "auto":
        return _make(FACTORIES[name], defects, source)
    reasons = []
    for candidate in AUTO_ORDER:
        try:
            return _make(FACTORIES[candidate], defects, source)
        except BackendUnavailable as exc:
            reasons.append(f"{candidate}: {exc}")
    raise BackendUnavailable("no backend usable: " + "; ".join(reasons))
