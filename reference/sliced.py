"""The finite fast paths of the verifier metrics, a cache-sized slice of a block at a time.

reference/metrics.py compares outputs in blocks of up to 2^20 elements. Over a whole block, each
of the dozen elementwise passes of a comparison streamed 8 MiB float64 temporaries through
memory, which a GPU host running one process per core shares between all of them. Here the
same passes run over slices of 2^15 elements, whose temporaries stay in the core's cache. The
block stays the unit of the one sum (the squared differences of a block go to one block-sized
buffer and one np.dot, as before); everything else is a maximum or a count, exact in any order.
So every metric keeps its bits: tests/unit/reference/test_reference_fastpaths.py pins these
paths to the plain formulas; the host time they save against the block-wise code is in
docs/evidence/README.md (host-2026-12-04).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.chunks import Workspace
from reference.reduce import row_max
from reference.rounding import round_to

TINY = float(np.finfo(np.float64).tiny)  # a Python float: x / TINY overflows to inf without a warning
REL_FLOOR = 1e-8  # rel_diff = abs_diff / max(|ref|, 1e-8)
# 256 KiB per float64 temporary, a handful of them live: L2-sized, and still long enough that
# numpy's per-call cost (about a microsecond) stays small against the work of a call.
SLICE_ELEMENTS = 1 << 15
F64 = np.dtype(np.float64)


def row_denominator(mag: np.ndarray, row_scale: np.ndarray | None) -> np.ndarray:
    """max(row peak of |ref|, |out|; the row's magnitude scale; tiny).

    The row scale is max_j sum_k p_k |v_kj| (attention of |V|): the size of the values an output
    row was averaged from. A row can cancel to nearly 0 (head_dim_v 1..7 shows it) while its
    rounding error stays proportional to that scale, so dividing by the row peak alone fails
    correct kernels; a wrong row still errs by the order of the scale."""
    return rows_denominator(row_max(mag), row_scale)


def rows_denominator(row_peak: np.ndarray, row_scale: np.ndarray | None) -> np.ndarray:
    """row_denominator from the row maxima of the magnitudes."""
    den = row_peak
    if row_scale is not None:
        den = np.maximum(den, np.where(np.isfinite(row_scale), row_scale, 0.0))
    return np.maximum(den, TINY)


def slices(rows: int, n: int):
    """[a, b) row ranges of about SLICE_ELEMENTS elements covering `rows` rows of n."""
    step = max(1, SLICE_ELEMENTS // max(n, 1))
    for a in range(0, rows, step):
        yield a, min(a + step, rows)


def cast_into(x: np.ndarray, dtype: np.dtype, dst: np.ndarray) -> np.ndarray:
    """dst[...] = x.astype(dtype) as float64 (dst float64), for finite x.

    float32 -> float16 goes through rounding.round_to, the same values at a fraction of numpy's
    conversion cost. Where x is not finite, or rounds to inf, dst is not finite either (all the
    caller checks before it falls back to the plain cast)."""
    if x.dtype == dtype:
        dst[...] = x
    elif x.dtype == np.float32 and dtype == np.float16:
        dst[...] = round_to(x, np.float16)
    else:
        dst[...] = x.astype(dtype)
    return dst


@dataclass
class BlockStats:
    """What one finite block adds to metrics._Accumulator."""

    sq_sum: float = 0.0
    count: int = 0
    max_abs: float = 0.0
    max_mag: float = 0.0
    max_rel: float = 0.0
    row_err: float = 0.0


def compare_block(r_raw: np.ndarray, o_raw: np.ndarray, w_raw: np.ndarray | None, row_scale: np.ndarray | None,
                  out_dtype: np.dtype, want_stats: bool, work: Workspace,
                  ) -> tuple[BlockStats | None, tuple[float, float] | None]:
    """One [rows, n] block of the reference, the output and optionally the low output, when finite.

    Returns (stats, ratio): stats is what _Accumulator.add_finite adds for (ref cast to
    out_dtype, out) (None when not wanted, or when an element of either is not finite: then
    nothing may be added and the caller takes the masked path); ratio is err_ratio's block
    maxima (max|out - ref|, max|low - ref|) with ref as given (None without w_raw, or when one
    is not finite). row_scale: float64 [rows] or None.
    """
    rows, n = o_raw.shape
    stats = BlockStats(count=rows * n) if want_stats else None
    ratio = [0.0, 0.0] if w_raw is not None else None
    diff_all = work.take("diff", (rows, n), F64) if want_stats else None
    same_type = r_raw.dtype == out_dtype  # the cast reference is the reference itself
    for a, b in slices(rows, n):
        shape = (b - a, n)
        o = work.take("o", shape, F64)
        o[...] = o_raw[a:b]
        r = None
        # With the reference as its own cast, max|out - ref| is the stats' max_abs of the slice.
        d_out = None
        if ratio is not None:
            r = work.take("r", shape, F64)
            r[...] = r_raw[a:b]
            t = work.take("t", shape, F64)
            with np.errstate(invalid="ignore"):  # inf - inf: not finite, the caller's masked path
                if not (same_type and stats is not None):
                    d_out = float(np.abs(np.subtract(o, r, out=t), out=t).max())
                t[...] = w_raw[a:b]
                d_low = float(np.abs(np.subtract(t, r, out=t), out=t).max())
            if (d_out is None or np.isfinite(d_out)) and np.isfinite(d_low):
                ratio = [ratio[0] if d_out is None else max(ratio[0], d_out), max(ratio[1], d_low)]
            else:
                ratio = None
        if stats is not None:
            if r is not None and same_type:
                rc = r  # err_ratio is done with it
            else:
                rc = cast_into(r_raw[a:b], out_dtype, work.take("rc", shape, F64))
            slice_max = _add_slice(stats, rc, o, diff_all[a:b], None if row_scale is None else row_scale[a:b], work)
            if slice_max is None:
                # A NaN or an inf in the reference or the output: in |out - ref| too.
                stats = None
                if d_out is None:
                    ratio = None
            elif ratio is not None and d_out is None:
                ratio[0] = max(ratio[0], slice_max)
        if stats is None and ratio is None:
            break
    if stats is not None:
        flat = diff_all.reshape(-1)
        stats.sq_sum = float(np.dot(flat, flat))
    return stats, None if ratio is None else (ratio[0], ratio[1])


def _add_slice(stats: BlockStats, r: np.ndarray, o: np.ndarray, diff: np.ndarray, row_scale: np.ndarray | None,
               work: Workspace) -> float | None:
    """_Accumulator.add_finite's passes over one slice into stats (r, o scratch; diff: the slice
    of the block's buffer). Returns the slice's max |r - o|, or None (stats partly updated) when
    an element is not finite. The maxima over the slice are those of its row maxima."""
    mag = np.abs(o, out=work.take("mag", o.shape, F64))
    with np.errstate(invalid="ignore"):  # inf - inf: caught by the max_mag test below
        np.subtract(r, o, out=diff)
    np.abs(diff, out=diff)
    abs_r = np.abs(r, out=r)
    np.maximum(mag, abs_r, out=mag)
    row_peak = row_max(mag)
    max_mag = float(row_peak.max())
    if not np.isfinite(max_mag):  # a NaN or an inf reaches its row's maximum
        return None
    row_diff = row_max(diff)
    max_abs = float(row_diff.max())
    stats.max_abs = max(stats.max_abs, max_abs)
    stats.max_mag = max(stats.max_mag, max_mag)
    zero_ref = abs_r == 0  # left out of max_rel
    rel = np.divide(diff, np.maximum(abs_r, REL_FLOOR, out=abs_r), out=abs_r)
    if zero_ref.any():
        rel[zero_ref] = 0.0
    stats.max_rel = max(stats.max_rel, float(rel.max()))
    row = row_diff / rows_denominator(row_peak, row_scale)
    stats.row_err = max(stats.row_err, float(row.max()))
    return max_abs


def partial_rows(r: np.ndarray, o: np.ndarray, work: Workspace) -> tuple[np.ndarray, np.ndarray]:
    """Per row of [rows, n] blocks (n >= 1; float32 partials): max_j |r - o| computed in float64,
    and max_j max(|r|, |o|) in their common type, as float64; NaN where a row holds one."""
    rows, n = o.shape
    mag_type = np.result_type(r.dtype, o.dtype)
    row_diff = np.empty(rows, dtype=F64)
    row_mag = np.empty(rows, dtype=mag_type)
    for a, b in slices(rows, n):
        shape = (b - a, n)
        diff = work.take("diff", shape, F64)
        with np.errstate(invalid="ignore"):  # inf - inf: caught by the caller's finiteness test
            np.subtract(r[a:b], o[a:b], out=diff, dtype=F64)
        np.abs(diff, out=diff)
        row_max(diff, out=row_diff[a:b])
        mag = np.abs(r[a:b], out=work.take("mag", shape, mag_type))
        np.maximum(mag, np.abs(o[a:b], out=work.take("mag_o", shape, mag_type)), out=mag)
        row_max(mag, out=row_mag[a:b])
    return row_diff, row_mag.astype(F64)
