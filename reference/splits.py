"""Split-KV arithmetic (SPEC §3), written once and shared by the reference and the cpu backend.

Three things live here: where each split starts and ends (per batch entry), which splits a
query row can see (valid_splits), and the per-split online softmax over block_n key tiles
that produces the f32 partials, with the two combines of the partials. The kernel defects
of kernels/backend.py DEFECTS are switches on this same code, so the emulation differs from
the reference only where a defect says so.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from reference.chunks import DEFAULT_BUDGET, Workspace, gather_rows, grouped_view, plan, scatter_rows
from reference.inputs import softmax_scale
from reference.masks import last_valid_keys, prefix_offsets, row_key_limits
from reference.rounding import round_to
from reference.logits import scale_logits

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
    """Splits holding at least one key a row may see, int64 [g, Hq, Sq] (SPEC §3).

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


def _gather_keys(work: Workspace, name: str, x: np.ndarray, index: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Rows `index` of x [bc, hc, Sk, d] as f32 [bc, hc, n_act, block_n, d], in a reused buffer."""
    picked = work.take(name + "_raw", x.shape[:2] + (len(index), x.shape[3]), x.dtype)
    np.take(x, index, axis=2, out=picked)
    tile = work.take(name, shape, F32)
    tile.reshape(picked.shape)[...] = picked
    return tile


def split_partials(c: AttentionConfig, inputs: Mapping[str, Any], block_n: int = 32,
                   defects: frozenset[str] = frozenset(), p_dtype: np.dtype | None = None,
                   o_partials: np.ndarray | None = None, lse_partials: np.ndarray | None = None,
                   budget: int = DEFAULT_BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """Every split's normalised partial O_s and LSE_s, f32 [S, g, Hq, Sq, Dv] and [S, g, Hq, Sq].

    What one split kernel does per row: walk its blocks in order, keep a running max m, a
    running sum l and an unnormalised acc, and finally write acc / l and m + log l. Every
    (split, row) entry is written, empty splits included (as O = 0, LSE = -inf), into the given
    buffers when passed (a backend passes NaN-filled ones). p_dtype rounds P before P·V as a
    tensor-core kernel does (None: P stays f32, as in the reference). `defects` holds names
    of kernels.backend.DEFECTS; the reference passes none.
    """
    S, hkv, ratio = c.split_kv, c.num_heads_kv, c.gqa_ratio
    dv, sk = c.head_dim_v, c.seq_len_k
    if o_partials is None:
        o_partials = np.empty((S, c.g, c.num_heads_q, c.seq_len_q, dv), dtype=F32)
    if lse_partials is None:
        lse_partials = np.empty((S, c.g, c.num_heads_q, c.seq_len_q), dtype=F32)
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
            m = np.full((bc, hc, S, rows), -np.inf, dtype=F32)
            l = np.zeros((bc, hc, S, rows), dtype=F32)
            acc = np.zeros((bc, hc, S, rows, dv), dtype=F32)
            for t in range(bps):
                # Splits that still have a block at step t: a prefix, since splits are contiguous.
                n_act = min(S, -(-(nb - t) // bps))
                if n_act <= 0:
                    break
                keys = (np.arange(n_act)[:, None] * bps + t) * block_n + tile_keys  # [n_act, bn]
                gather = np.minimum(keys, sk - 1).ravel()  # keys past the end are masked below
                kt = _gather_keys(work, "k", k_piece, gather, (bc, hc, n_act, block_n, c.head_dim_qk))
                s = work.take("s", (bc, hc, n_act, rows, block_n), F32)
                np.matmul(qs, np.swapaxes(kt, -1, -2), out=s)
                scale_logits(s, i8, zero_point, quant_scale, scale)
                if bias is not None:
                    bt = grouped_view(bias, piece, hkv, gather)  # [bc, hc, qc, ratio, n_act*bn]
                    s += np.moveaxis(bt.reshape(bc, hc, rows, n_act, block_n), 3, 2)
                if int(keys.max()) > min_limit:
                    hidden = keys[None, :, None, :] > limits[:, None, :, None]  # [bc, n_act, R, bn]
                    np.copyto(s, -np.inf, where=hidden[:, None])

                m_old = m[:, :, :n_act]
                m_new = np.maximum(m_old, s.max(axis=-1))
                # The -inf guard: a row that has seen no visible key yet subtracts 0, so
                # exp(-inf - 0) = 0 instead of exp(-inf - (-inf)) = NaN.
                m_sub = np.where(m_new == -np.inf, F32(0), m_new) if guard_neginf else m_new
                alpha = np.exp(m_old - m_sub)
                s -= m_sub[..., None]
                np.exp(s, out=s)
                l[:, :, :n_act] = l[:, :, :n_act] * alpha + s.sum(axis=-1)
                if p_dtype is not None:
                    round_to(s, p_dtype, out=s)
                vt = _gather_keys(work, "v", v_piece, gather, (bc, hc, n_act, block_n, dv))
                pv = work.take("pv", (bc, hc, n_act, rows, dv), F32)
                np.matmul(s, vt, out=pv)
                acc_act = acc[:, :, :n_act]
                acc_act *= alpha[..., None]
                acc_act += pv
                m[:, :, :n_act] = m_new

            if guard_zero_sum:  # a split with no visible key stores O = 0, LSE = -inf
                o = np.where(l[..., None] == 0, F32(0), acc / np.where(l == 0, F32(1), l)[..., None])
            else:
                o = acc / l[..., None]
            lse = np.where(l == 0, F32(-np.inf), m + np.log(l))
            for split in range(S):
                scatter_rows(o_partials[split], piece, hkv, o[:, :, split])
                scatter_rows(lse_partials[split], piece, hkv, lse[:, :, split])
    return o_partials, lse_partials


def combine_masked(o_partials: np.ndarray, lse_partials: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference combine (SPEC §3): valid splits only, f32. Returns (out, lse) in f32."""
    S = lse_partials.shape[0]
    is_valid = np.arange(S).reshape((S,) + (1,) * valid.ndim) < valid[None]
    lse_v = np.where(is_valid, lse_partials, F32(-np.inf)).astype(F32)
    top = lse_v.max(axis=0)
    top_safe = np.where(top == -np.inf, F32(0), top)
    with np.errstate(divide="ignore"):
        weights = np.where(is_valid, np.exp(lse_v - top_safe), F32(0)).astype(F32)
        denom = weights.sum(axis=0, dtype=F32)
        num = np.zeros(o_partials.shape[1:], dtype=F32)
        for s in range(S):
            num += np.where(is_valid[s][..., None], weights[s][..., None] * o_partials[s], F32(0))
        out = np.where(denom[..., None] > 0, num / np.where(denom > 0, denom, F32(1))[..., None], F32(0))
        lse = np.where(denom > 0, top_safe + np.log(denom), F32(-np.inf))
    return out.astype(F32), lse.astype(F32)


def combine_unmasked(o_partials: np.ndarray, lse_partials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A kernel's combine (SPEC §3): every split weighted by exp(LSE_s - M), no validity mask.

    M = -FLT_MAX when every LSE_s is -inf, the denominator guarded against 0; the max ignores
    NaN as fmaxf does, so a NaN partial reaches the output through its weight, as on a GPU.
    Returns (out, lse) in f32.
    """
    S = lse_partials.shape[0]
    with np.errstate(all="ignore"):
        top = np.fmax.reduce(lse_partials.astype(F32), axis=0)
        top = np.where(top == -np.inf, F32(-FLT_MAX), top).astype(F32)
        denom = np.zeros(lse_partials.shape[1:], dtype=F32)
        num = np.zeros(o_partials.shape[1:], dtype=F32)
        for s in range(S):
            w = np.exp(lse_partials[s] - top)
            denom += w
            num += w[..., None] * o_partials[s]
        inv = np.where(denom == 0, F32(0), F32(1) / denom).astype(F32)
        out = num * inv[..., None]
        lse = top + np.log(denom)
    return out.astype(F32), lse.astype(F32)
