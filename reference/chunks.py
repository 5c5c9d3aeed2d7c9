"""Cutting attention into pieces of bounded size, shared by every host computation.

A piece is (consecutive batch entries, a range of kv heads, a range of query rows). Inside a
piece the query heads that share a kv head are stacked row-wise ("grouped rows", q-major:
row (q - q0) * ratio + r is query head kv * ratio + r at row q), so GQA becomes one matmul
per kv head and a causal limit depends on the row's q only. Without the cut a 16k x 16k
logits matrix alone is 2 GiB in float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from reference.widen import widen_into

# Elements of the largest temporary of one piece. Small enough to stay near the caches and
# far below the 2 GiB bound, large enough that BLAS and ufunc calls amortise Python.
DEFAULT_BUDGET = 1 << 20


@dataclass(frozen=True)
class Piece:
    b0: int
    b1: int
    h0: int  # kv heads [h0, h1)
    h1: int
    q0: int  # query rows [q0, q1)
    q1: int

    @property
    def batches(self) -> slice:
        return slice(self.b0, self.b1)

    @property
    def kv_heads(self) -> slice:
        return slice(self.h0, self.h1)

    @property
    def rows(self) -> slice:
        return slice(self.q0, self.q1)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.b1 - self.b0, self.h1 - self.h0, self.q1 - self.q0


def plan(runs: list[tuple[int, int]], num_heads_kv: int, seq_len_q: int, unit_cost: int,
         head_cost: int = 0, budget: int = DEFAULT_BUDGET) -> Iterator[Piece]:
    """Pieces covering every (batch, kv head, row) once; a piece never spans two runs.

    unit_cost is the temporary size of one (batch, kv head, query row) unit (all its
    grouped query heads), head_cost that of one (batch, kv head) whatever its rows (its keys
    and values); whole batch entries are taken together while they fit. When one head does
    not fit, its rows are cut into blocks within the budget and the head cost comes on top,
    once (the caller keeps it across the head's blocks); a single unit over budget still runs
    as one row: the budget bounds memory, it does not refuse.
    """
    per_head = seq_len_q * unit_cost + head_cost
    per_batch = num_heads_kv * per_head
    for b0, b1 in runs:
        if per_batch <= budget:
            step = max(1, budget // per_batch)
            for b in range(b0, b1, step):
                yield Piece(b, min(b + step, b1), 0, num_heads_kv, 0, seq_len_q)
        elif per_head <= budget:
            step = budget // per_head
            for b in range(b0, b1):
                for h in range(0, num_heads_kv, step):
                    yield Piece(b, b + 1, h, min(h + step, num_heads_kv), 0, seq_len_q)
        else:
            # Row blocks of one head: callers keep the head's keys and values across its row
            # blocks, so the head cost is paid once and the rows get the whole budget.
            step = max(1, budget // unit_cost)
            for b in range(b0, b1):
                for h in range(num_heads_kv):
                    for q in range(0, seq_len_q, step):
                        yield Piece(b, b + 1, h, h + 1, q, min(q + step, seq_len_q))


def _grouped(x: np.ndarray, num_heads_kv: int) -> np.ndarray:
    """[g, Hq, Sq, ...] -> [g, Hkv, ratio, Sq, ...] (a view for contiguous input)."""
    g, hq = x.shape[:2]
    return x.reshape(g, num_heads_kv, hq // num_heads_kv, *x.shape[2:])


class Workspace:
    """Scratch buffers reused from piece to piece.

    A fresh multi-megabyte array per piece costs page faults on every piece whenever the
    allocator hands large blocks back to the OS; reusing a few buffers costs them once.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A contiguous uninitialised array of `shape`, backed by the buffer called `name`."""
        dtype = np.dtype(dtype)
        size = math.prod(shape)  # np.prod of a tuple costs microseconds, and this runs per tile
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = self._buffers[name] = np.empty(max(size, 1), dtype=dtype)
        return buffer[:size].reshape(shape)


def grouped_view(x: np.ndarray, piece: Piece, num_heads_kv: int, keys: slice | np.ndarray | None = None) -> np.ndarray:
    """A per-query-head tensor [g, Hq, Sq, n] of one piece, as [bc, hc, qc, ratio, n'] (a view
    unless `keys` is an index array); keys selects along the last axis (bias columns)."""
    g5 = _grouped(x, num_heads_kv)[piece.batches, piece.kv_heads, :, piece.rows]
    if keys is not None:
        g5 = g5[..., keys]
    return g5.transpose(0, 1, 3, 2, 4)


def gather_rows(x: np.ndarray, piece: Piece, num_heads_kv: int, dtype: np.dtype,
                keys: slice | np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """grouped_view copied into grouped rows [bc, hc, R, n'] of `dtype` (into `out` if given)."""
    view = grouped_view(x, piece, num_heads_kv, keys)
    bc, hc, qc, ratio, n = view.shape
    if out is None:
        out = np.empty((bc, hc, qc * ratio, n), dtype=dtype)
    widen_into(view, out.reshape(view.shape))
    return out


def scatter_rows(dst: np.ndarray, piece: Piece, num_heads_kv: int, values: np.ndarray) -> None:
    """Inverse of gather_rows: write grouped rows [bc, hc, R, ...] into dst [g, Hq, Sq, ...].

    dst must be contiguous (the grouped view then shares its memory).
    """
    if not dst.flags.c_contiguous:
        raise ValueError("scatter_rows needs a contiguous destination")
    bc, hc, qc = piece.shape
    ratio = dst.shape[1] // num_heads_kv
    v5 = values.reshape(bc, hc, qc, ratio, *values.shape[3:])
    _grouped(dst, num_heads_kv)[piece.batches, piece.kv_heads, :, piece.rows] = np.swapaxes(v5, 2, 3)


def rows_view(dst: np.ndarray, piece: Piece, num_heads_kv: int) -> np.ndarray | None:
    """dst [g, Hq, Sq, ...] (contiguous) as the grouped rows [bc, hc, R, ...] of one piece, a view
    that writes into dst, where one exists: with one query head per kv head, or one query row,
    grouped rows are dst's own rows. None otherwise (then scatter_rows copies them).

    Writing a piece's result there directly saves the scatter, a pass over the whole output.
    """
    bc, hc, qc = piece.shape
    ratio = dst.shape[1] // num_heads_kv
    g5 = _grouped(dst, num_heads_kv)[piece.batches, piece.kv_heads, :, piece.rows]  # [bc, hc, ratio, qc, ...]
    if ratio == 1:
        return g5[:, :, 0]
    if qc == 1:
        return g5[:, :, :, 0]
    return None


def split_rows_view(dst: np.ndarray, piece: Piece, num_heads_kv: int) -> np.ndarray | None:
    """rows_view for every split: dst [S, g, Hq, Sq, ...] (contiguous) as [bc, hc, S, R, ...], or None."""
    if not dst.flags.c_contiguous:
        return None
    S, g, hq = dst.shape[:3]
    bc, hc, qc = piece.shape
    ratio = hq // num_heads_kv
    g6 = dst.reshape(S, g, num_heads_kv, ratio, *dst.shape[3:])[:, piece.batches, piece.kv_heads, :, piece.rows]
    if ratio == 1:
        return g6[:, :, :, 0].transpose(1, 2, 0, *range(3, g6.ndim - 1))
    if qc == 1:
        return g6[:, :, :, :, 0].transpose(1, 2, 0, *range(3, g6.ndim - 1))
    return None


def scatter_splits(dst: np.ndarray, piece: Piece, num_heads_kv: int, values: np.ndarray) -> None:
    """scatter_rows for every split at once: values [bc, hc, S, R, ...] into dst [S, g, Hq, Sq, ...]
    (dst may be a prefix dst[:n] of a contiguous buffer).

    One assignment instead of one per split: with 128 splits of a small piece the per-call
    overhead of scatter_rows dominated the reference.
    """
    S, g, hq = dst.shape[:3]
    if S == 0:
        return
    if not dst.flags.c_contiguous:
        raise ValueError("scatter_splits needs a contiguous destination")
    bc, hc, qc = piece.shape
    ratio = hq // num_heads_kv
    tail = values.shape[4:]
    v6 = values.reshape(bc, hc, S, qc, ratio, *tail)  # grouped rows are q-major
    d6 = dst.reshape(S, g, num_heads_kv, ratio, *dst.shape[3:])
    d6[:, piece.batches, piece.kv_heads, :, piece.rows] = v6.transpose(2, 0, 1, 4, 3, *range(5, v6.ndim))


def add_widened(dst: np.ndarray, src: np.ndarray, work: Workspace) -> None:
    """dst += src, where src may be a strided view of a narrower float type (a bias tile).

    A ufunc casting a strided f16/bf16 operand goes through small buffers at 4-6 ns an
    element; copying the view as it is (unless it is contiguous already), then widening the
    contiguous copy (reference/widen.py), costs a fraction. Widening is exact, so the sums are
    the same bits.
    """
    if src.dtype == dst.dtype:
        dst += src
        return
    raw = src
    if not (src.flags.c_contiguous and src.shape == dst.shape):
        raw = work.take("widen_raw", dst.shape, src.dtype)
        raw[...] = src
    wide = work.take("widen", dst.shape, dst.dtype)
    widen_into(raw, wide)
    dst += wide
