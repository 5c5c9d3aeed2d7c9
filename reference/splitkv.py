"""The split-KV reference: the kernels' split arithmetic without their shortcuts (docs/spec.md §3).

It reproduces every partial a correct split kernel writes at the same block_n (so partials can
be checked, not only the final output), and combines them the reference way, over the valid
splits only. Its out_f32 equals the exact float64 output within f32 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from reference.chunks import scatter_rows, scatter_splits
from reference.inputs import as_config, output_dtypes
from reference.reduce import row_max
from reference.splits import F32, MaskedWeights, split_pieces, valid_splits


@dataclass(frozen=True)
class RowScales:
    """Row maxima of the split-KV reference on |V| (max_j sum_k p_k |v_kj|): the size of what each
    output row was averaged from; the verifier scales row errors by it (metrics._row_denominator)."""

    out: np.ndarray       # [g, Hq, Sq] f32, of the combined output
    partials: np.ndarray  # [S, g, Hq, Sq] f32, of each split's partial

    @classmethod
    def of(cls, magnitude: "SplitKVResult") -> "RowScales":
        """From a full |V| reference (magnitude_reference)."""
        return cls(out=magnitude.out_f32.max(axis=-1), partials=magnitude.o_partials.max(axis=-1))


@dataclass(frozen=True)
class SplitKVResult:
    out_f32: np.ndarray       # the combined output before the final cast
    lse_f32: np.ndarray
    o_partials: np.ndarray    # [S, g, Hq, Sq, Dv] f32 (S = 1 included; then out_f32 is o_partials[0])
    lse_partials: np.ndarray  # [S, g, Hq, Sq] f32
    valid_splits: np.ndarray  # [g, Hq, Sq] int64: split s is valid for a row iff s < this
    block_n: int
    row_scales: RowScales | None = None  # with magnitude=True
    storage: tuple[np.dtype, np.dtype] = (np.dtype(F32), np.dtype(F32))  # (O, LSE) types of a kernel

    # Cast on first use: the verifier compares with out_f32, and casting a large output to
    # bfloat16 costs as much as a metric pass.
    @cached_property
    def out(self) -> np.ndarray:
        """[g, Hq, Sq, Dv] in the output storage type (f16 for i8)."""
        return self.out_f32.astype(self.storage[0])

    @cached_property
    def lse(self) -> np.ndarray:
        """[g, Hq, Sq], f32 (f16 for i8), as a kernel returns it."""
        return self.lse_f32.astype(self.storage[1])


def attention_splitkv(config: AttentionConfig | Mapping[str, Any], inputs: Mapping[str, Any],
                      block_n: int = 32, magnitude: bool = False) -> SplitKVResult:
    """The partials, their masked combine, and with `magnitude` the RowScales of |V| from the
    same pass (what magnitude_reference computes, without a second Q·Kᵀ and softmax)."""
    c = as_config(config)
    if block_n < 1:
        raise ValueError(f"block_n={block_n} must be >= 1")
    S, hkv, ratio = c.split_kv, c.num_heads_kv, c.gqa_ratio
    rows_shape = (c.g, c.num_heads_q, c.seq_len_q)
    # Zeros, not empty: the splits a piece never reaches keep O = 0 without being written
    # (fresh zero pages cost nothing until touched, and partial_metrics skips all-invalid
    # splits of the reference), so 64 splits over 3 keys cost one split.
    # Likewise LSE = -inf and a row scale of 0 for the splits a piece never reaches: every
    # piece writes only its `used` splits (with many splits and few keys, most are not).
    o_partials = np.zeros((S, *rows_shape, c.head_dim_v), dtype=F32)
    lse_partials = np.full((S, *rows_shape), -np.inf, dtype=F32)
    valid = valid_splits(c, block_n)
    part_scale = np.zeros((S, *rows_shape), dtype=F32) if magnitude else None
    if S == 1:
        # One split is always valid (key 0 is visible), its weight is exactly 1: the combine
        # returns the partial bit for bit, so the output shares its memory.
        out_f32, lse_f32, out_scale = o_partials[0], lse_partials[0], None
    else:
        out_f32 = np.empty((*rows_shape, c.head_dim_v), dtype=F32)
        lse_f32 = np.empty(rows_shape, dtype=F32)
        out_scale = np.empty(rows_shape, dtype=F32) if magnitude else None
    valid_rows = valid[:, 0, :]  # [g, Sq]: the count depends on the batch entry and row only
    for part in split_pieces(c, inputs, block_n, magnitude=magnitude, fill_empty=False, o_dest=o_partials):
        piece, o, lse, o_mag, used = part.piece, part.o, part.lse, part.o_mag, part.used
        if not part.o_in_place:
            scatter_splits(o_partials[:used], piece, hkv, o[:, :, :used])
        scatter_splits(lse_partials[:used], piece, hkv, lse[:, :, :used])
        if magnitude:
            scatter_splits(part_scale[:used], piece, hkv, part.mag_rows)
        if S > 1:
            piece_valid = np.repeat(valid_rows[piece.batches, piece.rows], ratio, axis=1)[:, None, :]  # [bc, 1, R]
            # Splits first (transpose: np.moveaxis costs more than the work of a small piece).
            weights = MaskedWeights(lse.transpose(2, 0, 1, 3), piece_valid)  # reads O of valid splits only
            scatter_rows(out_f32, piece, hkv, weights.combine(o.transpose(2, 0, 1, 3, 4)))
            scatter_rows(lse_f32, piece, hkv, weights.lse)
            if magnitude:
                scatter_rows(out_scale, piece, hkv, weights.combine_row_max(o_mag.transpose(2, 0, 1, 3, 4)))
    if magnitude and S == 1:
        out_scale = part_scale[0]
    return SplitKVResult(
        out_f32=out_f32, lse_f32=lse_f32, o_partials=o_partials, lse_partials=lse_partials,
        valid_splits=valid, block_n=block_n, row_scales=RowScales(out_scale, part_scale) if magnitude else None,
        storage=output_dtypes(c),
    )


def magnitude_reference(config: AttentionConfig | Mapping[str, Any], inputs: Mapping[str, Any],
                        block_n: int = 32) -> SplitKVResult:
    """The split-KV reference on |V|: out_f32[..., j] = sum_k p_k |v_kj|, per split likewise.

    The size of what each output element was averaged from; the verifier scales row errors
    by it (reference/metrics.py, _row_denominator). attention_splitkv(magnitude=True) gives
    its row maxima (RowScales) from the reference's own pass, at no second softmax."""
    return attention_splitkv(config, {**inputs, "v": np.abs(np.asarray(inputs["v"]))}, block_n=block_n)
