"""Numeric facts of a config's inputs and reference: what the coverage report buckets.

Cheap beside the reference: the LSE facts read the reference's own LSE; the logit facts
compute the logits of at most FACT_ROWS query rows (spread evenly over batch, heads and rows)
in float64, against the keys each row may see.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from reference.masks import row_key_limits

FACT_ROWS = 16
FACT_KEYS = ("fact_masked_rows", "fact_max_abs_lse", "fact_max_abs_logit", "fact_top_weight", "fact_flatness")


def numeric_facts(c: AttentionConfig, inputs: Mapping[str, Any], lse: np.ndarray) -> dict[str, float | int]:
    """fact_masked_rows: rows whose reference LSE is -inf (no visible key);
    fact_max_abs_lse: largest finite |LSE| (0 when none);
    over the sampled rows: fact_max_abs_logit, the largest |logit| of a visible key;
    fact_top_weight, the mean of each row's largest softmax weight (1: one key takes all);
    fact_flatness, the largest (row's largest weight) x (its visible keys) (1: uniform)."""
    lse = np.asarray(lse, dtype=np.float64)
    finite = np.isfinite(lse)
    facts: dict[str, float | int] = {
        "fact_masked_rows": int((lse == -np.inf).sum()),
        "fact_max_abs_lse": float(np.abs(lse[finite]).max()) if finite.any() else 0.0,
    }
    rows = c.g * c.num_heads_q * c.seq_len_q
    picks = np.unique(np.linspace(0, rows - 1, num=min(FACT_ROWS, rows)).astype(np.int64))
    scale = 1.0 / math.sqrt(c.head_dim_qk) if c.with_attn_scale else 1.0
    limits = row_key_limits(c)
    max_logit, tops, flat = 0.0, [], 0.0
    for flat_row in picks:
        b, rest = divmod(int(flat_row), c.num_heads_q * c.seq_len_q)
        h, r = divmod(rest, c.seq_len_q)
        last = int(limits[b, r])
        if last < 0:
            continue
        q = np.asarray(inputs["q"][b, h, r], dtype=np.float64)
        k = np.asarray(inputs["k"][b, h // c.gqa_ratio, :last + 1], dtype=np.float64)
        s = k @ q
        if c.dtype == "i8":
            s = (s - inputs["quant_zero_point"]) * inputs["quant_scale"]
        s = s * scale
        if "bias" in inputs:
            s = s + np.asarray(inputs["bias"][b, h, r, :last + 1], dtype=np.float64)
        m = float(s.max())
        top = 1.0 / float(np.exp(s - m).sum())
        max_logit = max(max_logit, float(np.abs(s).max()))
        tops.append(top)
        flat = max(flat, top * (last + 1))
    facts.update(fact_max_abs_logit=max_logit, fact_top_weight=float(np.mean(tops)) if tops else 0.0,
                 fact_flatness=flat)
    return facts
