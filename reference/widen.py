"""Widening float16 and bfloat16 to float32, bit for bit, cheaper than numpy's casts.

numpy converts float16 in software, branch by branch: about 1.7 ns an element to float32 (2 ns
from a strided view), as long as a small matmul per element. Every float16 value is one of
2^16 bit patterns, so a table of their float32 values built once by that same cast answers
with a gather (about 0.85 ns). bfloat16 is the upper half of a float32: widening is a shift
(0.2 ns against ml_dtypes' 0.45). The reference widens every stored Q, K, V and bias element
it reads, the verifier every float16 output (the host time this saved a config:
docs/evidence/README.md, host-2026-12-04).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def widen_into(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst[...] = src, where dst has src's shape; the same bits as numpy's cast.

    src may be any view (strided, read-only); dst should be contiguous (np.take copies into a
    non-contiguous out through a temporary)."""
    if dst.dtype == F32 and src.dtype == F16 and src.shape == dst.shape:
        # mode="clip": every uint16 is a valid index, and "raise" would buffer the output.
        np.take(_F16_TO_F32, src.view(np.uint16), out=dst, mode="clip")
    elif dst.dtype == F32 and src.dtype == BF16 and src.shape == dst.shape:
        np.left_shift(src.view(np.uint16), 16, out=dst.view(np.uint32), dtype=np.uint32)
    else:
        dst[...] = src
    return dst
