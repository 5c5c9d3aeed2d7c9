"""Logit scaling shared by the exact and the split-KV paths (docs/spec.md §1)."""
from __future__ import annotations

import numpy as np


def scale_logits(s: np.ndarray, i8: bool, zero_point: float, quant_scale: float, scale: float) -> None:
    """In place: i8 dequantisation (acc - zero_point) * quant_scale, then the softmax scale.

    Float dtypes get the softmax scale here only for i8; their scale is folded into Q upstream."""
    if i8:
        s -= zero_point
        s *= quant_scale
        if scale != 1:
            s *= scale
