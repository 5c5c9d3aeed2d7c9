"""The split-KV reference: the kernels' split arithmetic without their shortcuts (SPEC §3).

It reproduces every partial a correct split kernel writes at the same block_n (so partials can
be checked, not only the final output), and combines them the reference way, over the valid
splits only. Its out_f32 equals the exact float64 output within f32 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from reference.inputs import as_config, output_dtypes
from reference.splits import combine_masked, split_partials, valid_splits


@dataclass(frozen=True)
class SplitKVResult:
    out: np.ndarray           # [g, Hq, Sq, Dv] in the output storage type (f16 for i8)
    lse: np.ndarray           # [g, Hq, Sq], f32 (f16 for i8), as a kernel returns it
    out_f32: np.ndarray       # the combined output before the final cast
    lse_f32: np.ndarray
    o_partials: np.ndarray    # [S, g, Hq, Sq, Dv] f32 (S = 1 included)
    lse_partials: np.ndarray  # [S, g, Hq, Sq] f32
    valid_splits: np.ndarray  # [g, Hq, Sq] int64: split s is valid for a row iff s < this
    block_n: int


def attention_splitkv(config: AttentionConfig | Mapping[str, Any], inputs: Mapping[str, Any],
                      block_n: int = 32) -> SplitKVResult:
    c = as_config(config)
    if block_n < 1:
        raise ValueError(f"block_n={block_n} must be >= 1")
    o_partials, lse_partials = split_partials(c, inputs, block_n)
    valid = valid_splits(c, block_n)
    out_f32, lse_f32 = combine_masked(o_partials, lse_partials, valid)
    out_dtype, lse_dtype = output_dtypes(c)
    return SplitKVResult(
        out=out_f32.astype(out_dtype), lse=lse_f32.astype(lse_dtype), out_f32=out_f32, lse_f32=lse_f32,
        o_partials=o_partials, lse_partials=lse_partials, valid_splits=valid, block_n=block_n,
    )


def magnitude_reference(config: AttentionConfig | Mapping[str, Any], inputs: Mapping[str, Any],
                        block_n: int = 32) -> SplitKVResult:
    """The split-KV reference on |V|: out_f32[..., j] = sum_k p_k |v_kj|, per split likewise.

    The size of what each output element was averaged from; the verifier scales row errors
    by it (reference/metrics.py, _row_denominator)."""
    return attention_splitkv(config, {**inputs, "v": np.abs(np.asarray(inputs["v"]))}, block_n=block_n)
