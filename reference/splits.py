"""Split-KV arithmetic (docs/spec.md §3), written once and shared by the reference and the cpu backend.

Three things live here: where each split starts and ends (per batch entry), which splits a
query row can see (valid_splits), and the per-split online softmax over block_n key tiles
that produces the f32 partials, with the two combines of the partials. The kernel defects
of kernels/defects.py DEFECTS are switches on this same code, so the emulation differs from
the reference only where a defect says so.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from attnconfig import AttentionConfig
from reference.chunks import (
    DEFAULT_BUDGET, Piece, Workspace, add_widened, gather_rows, grouped_view, plan, scatter_splits, split_rows_view,
)
from reference.inputs import softmax_scale
from reference.masks import last_valid_keys, prefix_offsets, row_key_limits
from reference.reduce import row_max
from reference.rounding import round_to
from reference.logits import scale_logits
from reference.widen import widen_into

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def n_blocks(last_key: int | np.ndarray, block_n: int) -> int | np.ndarray:
    """Blocks of block_n keys that hold keys 0..last_key."""
    return (last_key + block_n) // block_n


def blocks_per_split(n_blocks: int | np.ndarray, split_kv: int, floor: bool = False) -> int | np.ndarray:
    """Ceiling of n_blocks / split_kv; `floor` is the defect that gives 0 when n_blocks < S."""
    if floor:
        return n_blocks // split_kv
    return -(-n_blocks // split_kv)


def split_block_ranges(last_key: int, block_n: int, split_kv: int, floor: bool = False) -> list[tuple[int, int]]:
    """[start, end) block range of every split of one batch entry; start == end when empty."""
    nb = n_blocks(last_key, block_n)
    bps = blocks_per_split(nb, split_kv, floor)
    ranges = []
    for s in range(split_kv):
        start = min(s * bps, nb)
        ranges.append((start, max(start, min((s + 1) * bps, nb))))
    return ranges


def valid_splits(c: AttentionConfig, block_n: int) -> np.ndarray:
    """Splits holding at least one key a row may see, int64 [g, Hq, Sq] (docs/spec.md §3).

    Split s is valid for a row iff s < valid_splits[row]; one count per batch entry for
    non-causal configs, one per (batch, head, row) under causal and prefix-causal masks.
    """
    L = last_valid_keys(c)
    keys_per_split = block_n * blocks_per_split(n_blocks(L, block_n), c.split_kv)  # [g]
    if c.causal:
        rows = np.arange(c.seq_len_q, dtype=np.int64)
        row_last = np.maximum(0, np.minimum(rows[None, :] + prefix_offsets(c)[:, None], L[:, None]))  # [g, Sq]
    else:
        row_last = np.broadcast_to(L[:, None], (c.g, c.seq_len_q))
    count = np.minimum(c.split_kv, -(-(row_last + 1) // keys_per_split[:, None]))
    return np.ascontiguousarray(np.broadcast_to(count[:, None, :], (c.g, c.num_heads_q, c.seq_len_q)))


def _equal_runs(values: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs [b0, b1) of consecutive equal values (batch entries sharing split bounds)."""
    cuts = np.flatnonzero(np.diff(values)) + 1
    edges = [0, *cuts.tolist(), len(values)]
    return list(zip(edges[:-1], edges[1:]))


def _key_blocks(x: np.ndarray, axis: int, first: int, stride: int, n_act: int, block_n: int) -> np.ndarray:
    """A view of x whose key axis becomes (n_act, block_n): block i holds keys first + i*stride + [0, block_n).

    The caller checks that the last block ends inside the axis; a view instead of np.take
    saves a gathered copy per tile (and take is slow on the transposed layouts of trans_k/v).
    """
    lead = (slice(None),) * axis
    if first + n_act * stride <= x.shape[axis]:
        # The same view by slicing and splitting the axis: a few microseconds less than
        # as_strided, once per tile and tensor.
        window = x[lead + (slice(first, first + n_act * stride),)]
        split = window.reshape(x.shape[:axis] + (n_act, stride) + x.shape[axis + 1:])
        return split[lead + (slice(None), slice(0, block_n))]
    step = x.strides[axis]
    start = x[lead + (slice(first, None),)]
    shape = x.shape[:axis] + (n_act, block_n) + x.shape[axis + 1:]
    strides = x.strides[:axis] + (stride * step, step) + x.strides[axis + 1:]
    return as_strided(start, shape, strides, writeable=False)


def _ragged_blocks(dst: np.ndarray, x: np.ndarray, axis: int, first: int, stride: int, n_act: int,
                   block_n: int) -> np.ndarray:
    """dst = _key_blocks(x, ...) when the last block runs past the end of the key axis: its keys
    from the end on repeat the last key (they are masked; a clamped index gathered the same).

    Only the last block can: every other one ends before the block holding the last valid key.
    Copied in slices instead of gathered through an index array, at the cost of a plain copy.
    """
    sk = x.shape[axis]
    lead = (slice(None),) * axis
    full = n_act - 1
    if full:
        dst[lead + (slice(0, full),)] = _key_blocks(x, axis, first, stride, full, block_n)
    start = first + full * stride
    dst[lead + (full, slice(0, sk - start))] = x[lead + (slice(start, sk),)]
    dst[lead + (full, slice(sk - start, None))] = x[lead + (slice(sk - 1, sk),)]
    return dst


def split_partials(c: AttentionConfig, inputs: Mapping[str, Any], block_n: int = 32,
                   defects: frozenset[str] = frozenset(), p_dtype: np.dtype | None = None,
                   o_partials: np.ndarray | None = None, lse_partials: np.ndarray | None = None,
                   budget: int = DEFAULT_BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """Every split's normalised partial O_s and LSE_s, f32 [S, g, Hq, Sq, Dv] and [S, g, Hq, Sq].

    Every (split, row) entry is written, empty splits included (as O = 0, LSE = -inf), into the
    given buffers when passed (a backend passes NaN-filled ones). See split_pieces for the rest.
    """
    S, hkv = c.split_kv, c.num_heads_kv
    if o_partials is None:
        o_partials = np.empty((S, c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), dtype=F32)
    if lse_partials is None:
        lse_partials = np.empty((S, c.g, c.num_heads_q, c.seq_len_q), dtype=F32)
    for part in split_pieces(c, inputs, block_n, defects, p_dtype, budget=budget):
        scatter_splits(o_partials, part.piece, hkv, part.o)
        scatter_splits(lse_partials, part.piece, hkv, part.lse)
    return o_partials, lse_partials


class PiecePartials(NamedTuple):
    """What split_pieces yields for one piece; R are its grouped rows (reference/chunks.py)."""

    piece: Piece
    o: np.ndarray               # [bc, hc, S, R, Dv] f32
    lse: np.ndarray             # [bc, hc, S, R] f32
    used: int                   # splits from `used` on hold no block of this piece
    o_in_place: bool = False    # o is a view of split_pieces' o_dest (nothing to scatter)
    o_mag: np.ndarray | None = None     # [bc, hc, S, R, Dv] |V| partials (magnitude, split_kv > 1)
    mag_rows: np.ndarray | None = None  # [bc, hc, used, R] their row maxima (magnitude)


def split_pieces(c: AttentionConfig, inputs: Mapping[str, Any], block_n: int = 32,
                 defects: frozenset[str] = frozenset(), p_dtype: np.dtype | None = None,
                 magnitude: bool = False, budget: int = DEFAULT_BUDGET, fill_empty: bool = True,
                 o_dest: np.ndarray | None = None) -> Iterator[PiecePartials]:
    """The partials piece by piece (PiecePartials).

    What one split kernel does per row: walk its blocks in order, keep a running max m, a
    running sum l and an unnormalised acc, and finally write acc / l and m + log l; empty
    splits come out as O = 0, LSE = -inf. R are grouped rows (reference/chunks.py). p_dtype
    rounds P before P·V as a tensor-core kernel does (None: P stays f32, as in the reference).
    `defects` holds names of kernels.defects.DEFECTS; the reference passes none. `magnitude`
    also accumulates P·|V| with the same P (the row scales of the verifier), which costs one
    matmul per tile instead of a second pass over Q·Kᵀ and the softmax; the combine needs the
    |V| partials themselves only with several splits, the row scales only their row maxima.
    The arrays yielded are scratch buffers, overwritten by the next piece. fill_empty=False
    leaves O of the splits from `used` on unwritten, for a caller whose buffer already holds
    their value (0; NaN without the zero-sum guard): with many splits and few keys they are
    most of the partials. o_dest [S, g, Hq, Sq, Dv] (contiguous f32): where a piece's grouped
    rows are a view of it (chunks.split_rows_view), O accumulates there (o_in_place), which
    saves the caller's scatter, a pass over every partial.
    """
    S, hkv, ratio = c.split_kv, c.num_heads_kv, c.gqa_ratio
    dv, sk = c.head_dim_v, c.seq_len_k
    guard_neginf = "no_neginf_guard" not in defects
    guard_zero_sum = "no_zero_sum_guard" not in defects
    floor = "floor_blocks_per_split" in defects
    causal_shift = -1 if "causal_off_by_one" in defects else 0

    q, k, v, bias = inputs["q"], inputs["k"], inputs["v"], inputs.get("bias")
    if c.with_attn_bias and bias is None:
        raise ValueError("inputs: with_attn_bias is set but inputs has no 'bias'")
    i8 = c.dtype == "i8"
    scale = F32(softmax_scale(c))
    zero_point = F32(inputs["quant_zero_point"]) if i8 else 0
    quant_scale = F32(inputs["quant_scale"]) if i8 else 1

    L = last_valid_keys(c)
    limits_all = row_key_limits(c, causal_shift=causal_shift)  # [g, Sq]
    tile_keys = np.arange(block_n)
    unit = ratio * S * max(block_n, dv)
    keys_and_values = min(S * block_n, sk + block_n) * (c.head_dim_qk + dv)
    work = Workspace()
    with np.errstate(all="ignore"):  # the defects produce NaN on purpose
        for piece in plan(_equal_runs(L), hkv, c.seq_len_q, unit, keys_and_values, budget):
            bc, hc, qc = piece.shape
            rows = qc * ratio
            last = int(L[piece.b0])
            nb = int(n_blocks(last, block_n))
            bps = int(blocks_per_split(nb, S, floor))
            limits = np.repeat(limits_all[piece.batches, piece.rows], ratio, axis=1)  # [bc, R]
            min_limit = int(limits.min())

            qs = gather_rows(q, piece, hkv, F32, out=work.take("q", (bc, hc, rows, c.head_dim_qk), F32))
            if not i8 and scale != 1:
                qs *= scale
            qs = qs[:, :, None]  # broadcast over splits
            k_piece = k[piece.batches, piece.kv_heads]
            v_piece = v[piece.batches, piece.kv_heads]
            bias_piece = None
            if bias is not None:  # [bc, hc, qc, ratio, Sk]
                bias_piece = grouped_view(bias, piece, hkv)
            used = min(S, -(-nb // bps)) if bps > 0 else 0
            m = work.take("m", (bc, hc, S, rows), F32)
            m.fill(-np.inf)
            l = work.take("l", (bc, hc, S, rows), F32)
            l.fill(0)
            acc = None if o_dest is None else split_rows_view(o_dest, piece, hkv)
            o_in_place = acc is not None
            if acc is None:
                acc = work.take("acc", (bc, hc, S, rows, dv), F32)
            acc_mag = work.take("acc_mag", (bc, hc, S, rows, dv), F32) if magnitude else None
            if not guard_neginf:  # the guard lets the first tile skip the zeros (_accumulate)
                for a in (acc, acc_mag) if acc_mag is not None else (acc,):
                    a[:, :, :used].fill(0)
            for t in range(bps):
                # Splits that still have a block at step t: a prefix, since splits are contiguous.
                n_act = min(S, -(-(nb - t) // bps))
                if n_act <= 0:
                    break
                first, stride = t * block_n, bps * block_n
                last_key = first + (n_act - 1) * stride + block_n - 1  # the largest key of the tile
                in_range = last_key < sk
                kt = work.take("k", (bc, hc, n_act, block_n, c.head_dim_qk), F32)
                vt = work.take("v", (bc, hc, n_act, block_n, dv), F32)
                for tile, x, name in ((kt, k_piece, "k_raw"), (vt, v_piece, "v_raw")):
                    if in_range:
                        widen_into(_key_blocks(x, 2, first, stride, n_act, block_n), tile)
                    elif x.dtype == F32:
                        _ragged_blocks(tile, x, 2, first, stride, n_act, block_n)
                    else:  # the last block runs past the end: those keys are masked below
                        raw = work.take(name, tile.shape, x.dtype)
                        widen_into(_ragged_blocks(raw, x, 2, first, stride, n_act, block_n), tile)
                s = work.take("s", (bc, hc, n_act, rows, block_n), F32)
                np.matmul(qs, np.swapaxes(kt, -1, -2), out=s)
                scale_logits(s, i8, zero_point, quant_scale, scale)
                if bias_piece is not None:
                    s6 = s.reshape(bc, hc, n_act, qc, ratio, block_n)
                    if in_range:
                        bt = _key_blocks(bias_piece, 4, first, stride, n_act, block_n).transpose(0, 1, 4, 2, 3, 5)
                    else:  # in s6's layout, so that add_widened widens it without another copy
                        bt = work.take("bias_raw", s6.shape, bias.dtype)
                        _ragged_blocks(bt.transpose(0, 1, 3, 4, 2, 5), bias_piece, 4, first, stride, n_act, block_n)
                    add_widened(s6, bt, work)  # [bc, hc, n_act, qc, ratio, bn]
                if last_key > min_limit:
                    keys = (np.arange(n_act)[:, None] * bps + t) * block_n + tile_keys  # [n_act, bn]
                    hidden = keys[None, :, None, :] > limits[:, None, :, None]  # [bc, n_act, R, bn]
                    np.copyto(s, -np.inf, where=hidden[:, None])

                m_old = m[:, :, :n_act]
                m_new = np.maximum(m_old, row_max(s))
                # The -inf guard: a row that has seen no visible key yet subtracts 0, so
                # exp(-inf - 0) = 0 instead of exp(-inf - (-inf)) = NaN.
                m_sub = np.where(m_new == -np.inf, F32(0), m_new) if guard_neginf else m_new
                alpha = np.exp(m_old - m_sub)
                s -= m_sub[..., None]
                np.exp(s, out=s)
                l[:, :, :n_act] = l[:, :, :n_act] * alpha + s.sum(axis=-1)
                if p_dtype is not None:
                    round_to(s, p_dtype, out=s)
                pv = work.take("pv", (bc, hc, n_act, rows, dv), F32)
                np.matmul(s, vt, out=pv)
                first_tile = t == 0 and guard_neginf
                _accumulate(acc[:, :, :n_act], pv, alpha, first_tile)
                if acc_mag is not None:
                    np.matmul(s, np.abs(vt, out=vt), out=pv)
                    _accumulate(acc_mag[:, :, :n_act], pv, alpha, first_tile)
                m[:, :, :n_act] = m_new

            empty = l[:, :, :used] == 0
            any_empty = bool(empty.any())
            l_used = np.where(empty, F32(1), l[:, :, :used]) if guard_zero_sum else l[:, :, :used]
            mag_rows = None
            if acc_mag is not None and guard_zero_sum:
                # Division by l > 0 is monotonic, so the row maxima of acc / l are those of acc
                # divided by l, bit for bit: with one split only they are needed, not acc / l.
                mag_rows = np.divide(row_max(acc_mag[:, :, :used]), l_used)
                if any_empty:
                    mag_rows[empty] = F32(0)
                if S == 1:
                    acc_mag = None
            for a in (acc, acc_mag) if acc_mag is not None else (acc,):
                a_used = a[:, :, :used]
                np.divide(a_used, l_used[..., None], out=a_used)
                if guard_zero_sum and any_empty:  # a split with no visible key stores O = 0, LSE = -inf
                    np.copyto(a_used, F32(0), where=empty[..., None])
                if fill_empty:  # acc / l of a split without blocks: 0 / 1, or 0 / 0 unguarded
                    a[:, :, used:].fill(F32(0) if guard_zero_sum else F32(np.nan))
            if acc_mag is not None and mag_rows is None:
                mag_rows = row_max(acc_mag[:, :, :used])
            lse = np.where(l == 0, F32(-np.inf), m + np.log(l))
            yield PiecePartials(piece, acc, lse, used, o_in_place, acc_mag, mag_rows)


def _accumulate(acc: np.ndarray, pv: np.ndarray, alpha: np.ndarray, first_tile: bool) -> None:
    """acc = acc * alpha + pv, the online softmax's rescale and add.

    On a split's first tile acc is 0 and, with the -inf guard, alpha = exp(-inf - m) = 0, so the
    result is 0 + pv: one pass instead of zero-fill, multiply and add (most splits of a sweep
    hold one tile). Adding 0 keeps what the sum gave for a -0 in pv (+0), bit for bit.
    """
    if first_tile:
        np.add(pv, F32(0), out=acc)
        return
    acc *= alpha[..., None]
    acc += pv


class MaskedWeights:
    """exp(LSE_s - M) over the valid splits of each row: the reference combine's weights (docs/spec.md §3).

    lse [S, ...]; valid (broadcastable to lse's row shape) counts the valid splits of a row.
    """

    def __init__(self, lse: np.ndarray, valid: np.ndarray) -> None:
        S = lse.shape[0]
        valid = np.broadcast_to(valid, lse.shape[1:])
        self.is_valid = np.arange(S).reshape((S,) + (1,) * valid.ndim) < valid[None]
        # Splits below every row's count are valid everywhere, those above none: the
        # combine needs no mask for the first and skips the second (typical: 64 splits of
        # which 1 holds keys).
        self.n_all = min(S, int(valid.min())) if valid.size else 0
        self.n_any = min(S, int(valid.max())) if valid.size else 0
        lse_v = np.where(self.is_valid, lse, F32(-np.inf)).astype(F32)
        top = lse_v.max(axis=0)
        top_safe = np.where(top == -np.inf, F32(0), top)
        with np.errstate(divide="ignore"):
            self.weights = np.where(self.is_valid, np.exp(lse_v - top_safe), F32(0)).astype(F32)
            denom = self.weights[0].copy()
            # In split order, as a sum over axis 0 adds them; the splits from n_any on weigh +0
            # everywhere, and x + 0 is x for the weights' x >= 0, so they are left out.
            for s in range(1, self.n_any):
                denom += self.weights[s]
            self.positive = denom > 0
            self.denom = np.where(self.positive, denom, F32(1))
            self.lse = np.where(self.positive, top_safe + np.log(denom), F32(-np.inf)).astype(F32)

    def combine(self, o: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Σ_s w_s·O_s / Σ_s w_s over valid splits (0 where no weight); o [S, ..., Dv] -> f32."""
        out = self._numerator(o, out)
        np.divide(out, self.denom[..., None], out=out)
        if not self.positive.all():
            np.copyto(out, F32(0), where=~self.positive[..., None])
        return out

    def combine_row_max(self, o: np.ndarray) -> np.ndarray:
        """row_max(combine(o)) for o >= 0 (|V| partials): the row maxima of the numerator divided
        by the denominator, bit for bit (division by a positive number is monotonic), which
        saves the division of every element."""
        top = row_max(self._numerator(o))
        np.divide(top, self.denom, out=top)
        if not self.positive.all():
            top[~self.positive] = F32(0)
        return top

    def _numerator(self, o: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty(o.shape[1:], dtype=F32)
        out.fill(0)
        tmp = np.empty_like(out)
        for s in range(self.n_any):
            np.multiply(self.weights[s][..., None], o[s], out=tmp)
            if s >= self.n_all:
                np.copyto(tmp, F32(0), where=~self.is_valid[s][..., None])
            out += tmp
        return out


def combine_masked(o_partials: np.ndarray, lse_partials: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference combine (docs/spec.md §3): valid splits only, f32. Returns (out, lse) in f32."""
    weights = MaskedWeights(lse_partials, valid)
    return weights.combine(o_partials), weights.lse


def combine_unmasked(o_partials: np.ndarray, lse_partials: np.ndarray,
                     defects: frozenset[str] | set[str] = frozenset()) -> tuple[np.ndarray, np.ndarray]:
    """A kernel's combine (docs/spec.md §3): every split weighted by exp(LSE_s - M), no validity mask.

    M = -FLT_MAX when every LSE_s is -inf, the denominator guarded against 0; the max ignores
    NaN as fmaxf does, so a NaN partial reaches the output through its weight, as on a GPU.
    The combine_no_max_shift defect weights by exp(LSE_s) and returns log(denominator) as LSE.
    Returns (out, lse) in f32.
    """
    S = lse_partials.shape[0]
    with np.errstate(all="ignore"):
        top = np.fmax.reduce(lse_partials.astype(F32), axis=0)
        top = np.where(top == -np.inf, F32(-FLT_MAX), top).astype(F32)
        denom = np.zeros(lse_partials.shape[1:], dtype=F32)
        num = np.zeros(o_partials.shape[1:], dtype=F32)
        tmp = np.empty_like(num)
        shift = top if "combine_no_max_shift" not in defects else F32(0)
        for s in range(S):
            w = np.exp(lse_partials[s] - shift)
            denom += w
            np.multiply(w[..., None], o_partials[s], out=tmp)
            num += tmp
        inv = np.where(denom == 0, F32(0), F32(1) / denom).astype(F32)
        num *= inv[..., None]
        lse = shift + np.log(denom)
    return num, lse.astype(F32)
