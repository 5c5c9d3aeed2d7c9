"""Keep freed memory in a computing process, so the next config does not fault it in again.

Every config allocates its inputs, the reference's arrays and the outputs afresh, hundreds of
megabytes for a large one. glibc serves blocks over its mmap threshold (at most 32 MiB) with
mmap and unmaps them on free, and trims the heap top down to 128 KiB; the next config's
arrays then take a page fault per page and the kernel zeroes each page first. Kept instead, a
cpu-backend sweep ran 1.17-1.22x faster on a 2-core machine, but a 16-process sweep on the
H200's host 0.99x, holding 4.6x the memory between configs (bench/sweep.py --baseline-env
ATTNSWEEP_HEAP_RETAIN_MB=0 prints the ratio, and the memory it costs): off by default.

With mmap off, and a trim threshold and top pad of `retain` bytes, big blocks come from the
heap, and of the freed heap top the first `retain` bytes stay mapped for the next config while
the rest goes back to the system. A process's setting holds for its life. Python's own
small-object arenas do not go through malloc and are not affected.

glibc only (mallopt); elsewhere nothing changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
MAX_RETAIN_MB = 2047  # mallopt takes an int

_applied: int | None = None


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def retain_freed_memory(retain_mb: int) -> bool:
    """Make this process keep up to `retain_mb` MiB of freed memory mapped (0: glibc's defaults,
    left as they are). True when the setting is in force; idempotent."""
    global _applied
    if not 0 <= retain_mb <= MAX_RETAIN_MB:
        raise ValueError(f"heap_retain_mb={retain_mb}: must be between 0 and {MAX_RETAIN_MB}")
    if retain_mb == 0:
        return False
    if _applied == retain_mb:
        return True
    libc = _libc()
    if libc is None:
        return False
    # The trim threshold alone would return all of a heap top larger than it; the top pad is
    # what a trim leaves.
    ok = all(libc.mallopt(param, value) == 1 for param, value in
             ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, retain_mb << 20), (M_TOP_PAD, retain_mb << 20)))
    if not ok:
        log.warning("mallopt refused the heap settings; freed memory goes back to the system as before")
        return False
    _applied = retain_mb
    return True
