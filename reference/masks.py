"""Which keys a query row may see (docs/spec.md §2).

Both masks hide a suffix of the key axis, so a row's visibility is one number: the last key
it may see. Everything downstream (the exact reference, the split boundaries, the kernel
emulation) works from that limit instead of materialising [Sq, Sk] boolean masks.
"""
from __future__ import annotations

import numpy as np

from attnconfig import AttentionConfig


def last_valid_keys(c: AttentionConfig) -> np.ndarray:
    """L_b per batch entry: current_seq_len[b], or seq_len_k - 1 (int64 [g])."""
    if c.current_seq_len is not None:
        return np.asarray(c.current_seq_len, dtype=np.int64)
    return np.full(c.g, c.seq_len_k - 1, dtype=np.int64)


def prefix_offsets(c: AttentionConfig) -> np.ndarray:
    """prefix_offset[b] (0 when null) as int64 [g]."""
    if c.prefix_offset is not None:
        return np.asarray(c.prefix_offset, dtype=np.int64)
    return np.zeros(c.g, dtype=np.int64)


def row_key_limits(c: AttentionConfig, rows: np.ndarray | None = None, causal_shift: int = 0) -> np.ndarray:
    """Last visible key per (batch, query row), int64 [g, len(rows)]; -1 means none visible.

    causal_shift=-1 reproduces the kernels' off-by-one defect (hiding key j == q + prefix);
    the reference always uses 0.
    """
    if rows is None:
        rows = np.arange(c.seq_len_q, dtype=np.int64)
    L = last_valid_keys(c)[:, None]
    if not c.causal:
        return np.broadcast_to(L, (c.g, len(rows))).copy()
    bound = rows[None, :] + prefix_offsets(c)[:, None] + causal_shift
    return np.minimum(L, bound)


def visible(c: AttentionConfig, b: int) -> np.ndarray:
    """Boolean [Sq, Sk] visibility of batch entry b, for tests and small inspections."""
    limits = row_key_limits(c)[b]
    return np.arange(c.seq_len_k)[None, :] <= limits[:, None]
