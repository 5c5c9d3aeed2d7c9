"""The "low" attention of docs/spec.md §4: what a correct low-precision kernel computes.

err_ratio divides a kernel's error by this computation's error, so the tolerance follows the
shape (long rows, large heads) instead of one fixed number (FlashAttention's test rule).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from reference.exact import dense_attention
from reference.inputs import as_config, output_dtypes, value_dtype
from reference.rounding import round_to


def attention_lowprec(config: AttentionConfig | Mapping[str, Any], inputs: Mapping[str, Any],
                      as_float32: bool = False) -> np.ndarray:
    """O [g, Hq, Sq, Dv] in the output storage type: f32 math on the stored inputs, P rounded
    to the storage type (f16 for i8) before P·V, the result rounded once.

    as_float32: the same values held in float32, for a caller that widens them anyway (the
    verifier): numpy's float16 conversion costs more than the rounding (rounding.round_to)."""
    c = as_config(config)
    p_dtype = None if c.dtype == "f32" else value_dtype(c.dtype)
    out, _ = dense_attention(c, inputs, np.dtype(np.float32), p_dtype=p_dtype)
    if as_float32:
        return round_to(out, output_dtypes(c)[0], out=out)
    return out.astype(output_dtypes(c)[0])
