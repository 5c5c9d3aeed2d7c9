"""One BLAS thread per process wherever several processes compute side by side.

`attnsweep run --jobs N` and `attnsweep worker --concurrency N` both run N processes that each
do numpy matmuls; with BLAS's default of one thread per core, N processes start N x cores
threads and slow each other down. BLAS reads these variables once, when numpy is first
imported, so the cap must be set before the computing processes import numpy: before a spawned
pool starts, or before a forking worker imports it in its parent. Variables already set win.
"""
from __future__ import annotations

import os

BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def cap_blas_threads() -> None:
    """Default every BLAS thread variable to 1 in this process's environment (children inherit it)."""
    for var in BLAS_THREAD_VARS:
        os.environ.setdefault(var, "1")
