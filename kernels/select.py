"""Pick a backend by name: `auto` takes the first usable of cuda, hip, then the cpu emulation.

Each runtime is imported only when its backend is tried, so choosing `cpu` never touches
cuda-python or hip-python, and `auto` on a machine without GPUs falls through quietly.
"""
from __future__ import annotations

from typing import Callable

from kernels.backend import Backend, BackendUnavailable

BACKEND_NAMES = ("auto", "cpu", "cuda", "hip")
AUTO_ORDER = ("cuda", "hip", "cpu")


def _cuda(defects: frozenset[str]) -> Backend:
    from kernels.cuda import CudaBackend

    return CudaBackend(defects)


def _hip(defects: frozenset[str]) -> Backend:
    from kernels.hip import HipBackend

    return HipBackend(defects)


def _cpu(defects: frozenset[str]) -> Backend:
    from kernels.cpu import CpuEmulationBackend

    return CpuEmulationBackend(defects)


FACTORIES: dict[str, Callable[[frozenset[str]], Backend]] = {"cuda": _cuda, "hip": _hip, "cpu": _cpu}


def get_backend(name: str = "auto", defects: frozenset[str] | set[str] | tuple[str, ...] = frozenset()) -> Backend:
    """The backend called `name` ("auto", "cpu", "cuda", "hip") compiled with `defects`.

    Raises BackendUnavailable when a named GPU backend cannot run here (auto never does: it
    falls back to cpu), ValueError for an unknown name or defect."""
    defects = frozenset(defects)
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend: unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name != "auto":
        return FACTORIES[name](defects)
    reasons = []
    for candidate in AUTO_ORDER:
        try:
            return FACTORIES[candidate](defects)
        except BackendUnavailable as exc:
            reasons.append(f"{candidate}: {exc}")
    raise BackendUnavailable("no backend usable: " + "; ".join(reasons))
