"""Names of the input data regimes (docs/spec.md §1 "Input regimes").

A regime says what the input tensors of a config look like; `reference.regimes` builds them.
The names live here, beside the config model, because the config field `data_regime`, the
sweep request and the coverage report all speak them.
"""
from __future__ import annotations

from typing import Literal

# `normal` first: the default, and the regime every config had before the field existed.
REGIMES = ("normal", "sink", "outliers", "large_logits", "uniform", "cancellation")
Regime = Literal["normal", "sink", "outliers", "large_logits", "uniform", "cancellation"]
DEFAULT_REGIME = "normal"

REGIME_DESCRIPTIONS = {
    "normal": "standard normal Q, K, V (and bias), rounded to the dtype",
    "sink": "one key per batch entry (an attention sink) takes almost all the weight of every query row",
    "outliers": "a few channels of Q and K are 10-100x the rest (16x for i8)",
    "large_logits": "Q and K share a large mean, so every logit and |LSE| is in the hundreds",
    "uniform": "tiny logits (Q and the bias scaled down): near-uniform attention",
    "cancellation": "V holds large values of opposite signs per key, so P·V cancels",
}
