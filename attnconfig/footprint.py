"""Sizes derived from a config alone, shared by the prefilters and the backends' allocations."""
from __future__ import annotations

from attnconfig.config import AttentionConfig

PARTIAL_BYTES = 4  # partial O_s and LSE_s are f32 on every backend (docs/spec.md §3)


def splitkv_extra_bytes(c: AttentionConfig) -> int:
    """Bytes of the split-KV partial buffers: S·g·Hq·Sq·(Dv+1)·4; none when split_kv == 1."""
    if c.split_kv == 1:
        return 0
    return c.split_kv * c.g * c.num_heads_q * c.seq_len_q * (c.head_dim_v + 1) * PARTIAL_BYTES
