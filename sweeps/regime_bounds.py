"""Gate bounds of the data regimes other than `normal` (docs/spec.md §5, "Regimes").

GATE_BOUNDS were measured on `normal` inputs, whose logits stay below about 200. A correct
kernel's logits carry an absolute error of a few float32 ulps of their own size (the products
accumulate in f32), so where a regime makes logits large (large_logits, outliers, sink) a
softmax weight is off by that much relatively, an output row by about twice it, and an LSE
by a few ulps of its size; the i8 LSE is stored in f16, where one ulp at |LSE| 1000 is 0.5.
The bounds below grow with the regime's logit scale (reference.regimes.RegimePlan.logit_scale,
known from the config before anything runs) and never drop below the table's.

`uniform` shrinks the output (an average of many V rows nearly equally weighted), which out_rms
divides by, while P's rounding error does not shrink with it: its RMS threshold is
UNIFORM_RMS_FACTOR times the dtype's. The row gate, normalised by the rows of |P|·|V|, is
unchanged.

LOGIT_ULPS is set by the correct kernels on a GPU (tools/evidence/regimes.py, a sweep of each
regime): the error analysis's 8 failed `outliers` configs on the LSE gate (their large channels'
products sum to more than the logit spread the scale estimates); 64 leaves about twice the worst
error seen in any regime (docs/decisions.md, "Regime bounds").
"""
from __future__ import annotations

import math

import numpy as np

from attnconfig.config import AttentionConfig
from reference.regimes import regime_plan

LOGIT_ULPS = 64         # f32 ulps of the logit scale a correct kernel's logits may be off by
UNIFORM_RMS_FACTOR = 4


def _ulp(x: float, dtype: type) -> float:
    x = abs(float(x))
    if not math.isfinite(x):
        return math.inf
    return float(np.spacing(dtype(x)))


def lse_scale(c: AttentionConfig) -> float:
    """A bound on |LSE| of a regime config: its logit scale plus log of its keys."""
    return regime_plan(c).logit_scale + math.log(c.seq_len_k)


def regime_bounds(c: AttentionConfig, row: float, lse: float) -> tuple[float, float]:
    """(row bound, LSE bound) for config c, given the table's; unchanged for `normal`."""
    if c.data_regime == "normal":
        return row, lse
    scale = lse_scale(c)
    logit_err = LOGIT_ULPS * _ulp(scale, np.float32)
    row = max(row, 2.0 * logit_err)
    lse = max(lse, logit_err)
    if c.dtype == "i8":
        lse = max(lse, _ulp(scale, np.float16))  # the f16 LSE: one ulp of rounding either way
    return row, lse
