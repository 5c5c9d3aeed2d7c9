"""The exact reference: one softmax over all visible keys, in float64 (docs/spec.md §1, §2).

No split-KV, no tiling, no rounding beyond float64: it defines the right answer, and the
split-KV reference and every kernel are judged against it. A fully masked row (reachable
only through a -inf bias) gives O = 0 and LSE = -inf, never NaN.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from attnconfig import AttentionConfig
from reference.chunks import (
    DEFAULT_BUDGET, Piece, Workspace, add_widened, gather_rows, grouped_view, plan, rows_view, scatter_rows,
)
from reference.inputs import as_config, softmax_scale
from reference.masks import row_key_limits
from reference.reduce import row_max
from reference.rounding import round_to
from reference.logits import scale_logits
from reference.widen import widen_into


def attention_exact(config: AttentionConfig | Mapping[str, Any], inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(out [g, Hq, Sq, Dv], lse [g, Hq, Sq]) in float64; lse is the natural log-sum-exp."""
    return dense_attention(as_config(config), inputs, np.dtype(np.float64))


def dense_attention(c: AttentionConfig, inputs: Mapping[str, Any], compute: np.dtype,
                    p_dtype: np.dtype | None = None, budget: int = DEFAULT_BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """Softmax attention in `compute` precision, piece by piece.

    p_dtype rounds the normalised probabilities before P·V (the low-precision variant of
    docs/spec.md §4); None keeps them in `compute`. Single-threaded on purpose: BLAS threads itself,
    and Python threads over pieces oversubscribe it (measured slower on every bench shape).
    """
    compute = np.dtype(compute)
    if c.with_attn_bias and inputs.get("bias") is None:
        raise ValueError("inputs: with_attn_bias is set but inputs has no 'bias'")
    out = np.empty((c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), dtype=compute)
    lse = np.empty((c.g, c.num_heads_q, c.seq_len_q), dtype=compute)
    limits = row_key_limits(c)  # [g, Sq]
    unit = c.gqa_ratio * max(c.seq_len_k, c.head_dim_v)
    keys_and_values = c.seq_len_k * (c.head_dim_qk + c.head_dim_v)
    pieces = plan([(0, c.g)], c.num_heads_kv, c.seq_len_q, unit, keys_and_values, budget)
    _attend(c, inputs, compute, p_dtype, limits, pieces, out, lse)
    return out, lse


def _attend(c: AttentionConfig, inputs: Mapping[str, Any], compute: np.dtype, p_dtype: np.dtype | None,
            all_limits: np.ndarray, pieces: Iterable[Piece], out: np.ndarray, lse: np.ndarray) -> None:
    """Write out and lse row by row for every piece."""
    hkv, ratio = c.num_heads_kv, c.gqa_ratio
    q, k, v, bias = inputs["q"], inputs["k"], inputs["v"], inputs.get("bias")
    scale = compute.type(softmax_scale(c))
    i8 = c.dtype == "i8"
    zero_point = compute.type(inputs["quant_zero_point"]) if i8 else 0
    quant_scale = compute.type(inputs["quant_scale"]) if i8 else 1
    work = Workspace()
    cached_heads, k_cast, v_cast = None, None, None
    for piece in pieces:
        bc, hc, qc = piece.shape
        rows = qc * ratio
        limits = all_limits[piece.batches, piece.rows]  # [bc, qc]
        # Keys past every row's limit cannot contribute: leave them out of the matmuls.
        n_keys = int(limits.max()) + 1
        heads = (piece.b0, piece.b1, piece.h0, piece.h1)
        if heads != cached_heads:  # cast K and V once per head, not once per row block
            head_keys = int(all_limits[piece.batches].max()) + 1
            k_cast = work.take("k", (bc, hc, head_keys, c.head_dim_qk), compute)
            widen_into(k[piece.batches, piece.kv_heads, :head_keys], k_cast)
            v_cast = work.take("v", (bc, hc, head_keys, c.head_dim_v), compute)
            widen_into(v[piece.batches, piece.kv_heads, :head_keys], v_cast)
            cached_heads = heads

        qs = gather_rows(q, piece, hkv, compute, out=work.take("q", (bc, hc, rows, c.head_dim_qk), compute))
        if not i8 and scale != 1:
            qs *= scale
        s = work.take("s", (bc, hc, rows, n_keys), compute)
        np.matmul(qs, np.swapaxes(k_cast[:, :, :n_keys], -1, -2), out=s)
        s5 = s.reshape(bc, hc, qc, ratio, n_keys)
        scale_logits(s, i8, zero_point, quant_scale, scale)
        if bias is not None:
            add_widened(s5, grouped_view(bias, piece, hkv, slice(0, n_keys)), work)
        first_hidden = int(limits.min()) + 1
        if first_hidden < n_keys:  # mask only the ragged band of keys some rows may not see
            hidden = np.arange(first_hidden, n_keys) > limits[..., None]  # [bc, qc, band]
            np.copyto(s5[..., first_hidden:], -np.inf, where=hidden[:, None, :, None, :])

        m = row_max(s)[..., None]
        m[m == -np.inf] = 0  # fully masked row: exp(-inf - 0) = 0 instead of NaN
        s -= m
        np.exp(s, out=s)
        l = s.sum(axis=-1)
        with np.errstate(divide="ignore"):
            inv = np.where(l > 0, 1 / np.where(l > 0, l, 1), 0).astype(compute)
            lse_piece = np.where(l > 0, m[..., 0] + np.log(l), -np.inf)
        o_in_place = rows_view(out, piece, hkv)  # the matmul then writes the output itself
        o = work.take("o", (bc, hc, rows, c.head_dim_v), compute) if o_in_place is None else o_in_place
        if p_dtype is None:
            np.matmul(s, v_cast[:, :, :n_keys], out=o)
            o *= inv[..., None]
        else:
            s *= inv[..., None]
            round_to(s, p_dtype, out=s)
            np.matmul(s, v_cast[:, :, :n_keys], out=o)
        if o_in_place is None:
            scatter_rows(out, piece, hkv, o)
        scatter_rows(lse, piece, hkv, lse_piece)
