"""Page-locked host arrays for a device backend's copies, reused from config to config.

A copy from pageable memory goes through the driver's staging buffer at the CPU's pace: with 16
sweep workers copying at once, 3.8 GB/s a process, against 28 GB/s from page-locked memory
(bench/transfers.py, docs/evidence/gpu-2026-12-04-host/call2-transfers.txt). So a config's
inputs are drawn, and its outputs copied back, straight into page-locked blocks. Locking pages
is slow (the driver maps them), hence the reuse: a block goes back to the pool when the last
array on it is gone, whatever views of it the reference and the verifier made.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

import numpy as np

# Below this an array is plain numpy memory: its copy is short either way.
MIN_BYTES = 1 << 20


class _Lease:
    """The owner of one handed-out array's memory: at the bottom of the base chain of the array
    and of every view of it, so it lives exactly as long as they do. Bytes, viewed as the
    dtype after: the array interface cannot name a dtype numpy does not know (bfloat16)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def is_pinned(array: np.ndarray) -> bool:
    """Whether `array`, or the array it is a view of, lies in a PinnedPool block."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, _Lease)


class PinnedPool:
    """Blocks of page-locked memory in power-of-two sizes from `alloc(nbytes) -> address` (and
    back through `free`), at most `limit` bytes of them; an array that does not fit is ordinary
    numpy memory. The caller keeps whatever `alloc` needs alive (CUDA: the context) as long as
    the process may touch an array: blocks are freed only by `trim` and `close`, idle ones."""

    def __init__(self, alloc: Callable[[int], int], free: Callable[[int], None], limit: int,
                 min_bytes: int = MIN_BYTES):
        self._alloc, self._free = alloc, free
        self.limit, self.min_bytes = limit, min_bytes
        self.held = 0                      # bytes of blocks, leased or idle
        self._idle: dict[int, list[int]] = {}
        self._lock = threading.Lock()      # a lease may be collected on any thread
        self.closed = False

    def empty(self, shape: tuple[int, ...] | int, dtype: np.dtype | type = np.float64) -> np.ndarray:
        """An uninitialised C-contiguous array, page-locked when it is large enough and fits."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < self.min_bytes or self.closed or nbytes > self.limit:
            return np.empty(shape, dtype)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            idle = self._idle.get(size)
            ptr = idle.pop() if idle else None
            if ptr is None:
                if self.held + size > self.limit:
                    self._trim_locked(self.limit - size)
                if self.held + size > self.limit:
                    return np.empty(shape, dtype)
                ptr = self._alloc(size)
                self.held += size
        lease = _Lease(ptr, nbytes)
        weakref.finalize(lease, self._release, size, ptr)
        return np.asarray(lease).view(dtype).reshape(shape)

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(size * len(ptrs) for size, ptrs in self._idle.items())

    def _release(self, size: int, ptr: int) -> None:
        with self._lock:
            if self.closed:
                self._free(ptr)
                self.held -= size
            else:
                self._idle.setdefault(size, []).append(ptr)

    def _trim_locked(self, target: int) -> None:
        """Free idle blocks, largest first, until at most `target` bytes are held."""
        for size in sorted(self._idle, reverse=True):
            ptrs = self._idle[size]
            while ptrs and self.held > target:
                self._free(ptrs.pop())
                self.held -= size

    def close(self) -> None:
        """Free the idle blocks now, the leased ones when their arrays are gone."""
        with self._lock:
            self.closed = True
            self._trim_locked(0)
