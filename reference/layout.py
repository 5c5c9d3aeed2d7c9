"""Logical <-> physical layout of one tensor, per its trans_* flag (docs/spec.md §1).

Logical is [..., seq, dim]; a true trans_* flag stores [..., dim, seq]. Swapping the last two
axes is its own inverse, so the pair exists for the reader: backends copy *in* with
to_physical and *out* with to_logical, and a mix-up shows as a shape error, not bad data.
"""
from __future__ import annotations

import numpy as np


def to_physical(x: np.ndarray, trans: bool) -> np.ndarray:
    """The contiguous buffer a kernel reads: [..., dim, seq] when trans, else [..., seq, dim]."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2) if trans else x)


def to_logical(x: np.ndarray, trans: bool) -> np.ndarray:
    """Back from a kernel's physical buffer to the logical [..., seq, dim], contiguous."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2) if trans else x)


def logical_view(buffer: np.ndarray, trans: bool) -> np.ndarray:
    """A writable logical-index view of a physical buffer (how a kernel addresses its output)."""
    return np.swapaxes(buffer, -1, -2) if trans else buffer
