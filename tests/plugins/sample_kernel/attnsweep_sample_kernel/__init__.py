"""A kernel plug-in written as its users would: plain numpy attention in float32 that imports
nothing of attnsweep. The interface is duck-typed: name, version, supports(config),
run(config, inputs)."""
from __future__ import annotations

import numpy as np

__version__ = "0.1.0"


class NumpyAttention:
    name = "numpy-attention"
    version = __version__
    device = "cpu"

    def supports(self, config):
        if config.dtype == "i8":
            return "dtype_i8: this kernel has no int8 path"
        return None

    def run(self, config, inputs):
        c = config
        q = inputs["q"].astype(np.float32)
        k = np.repeat(inputs["k"].astype(np.float32), c.num_heads_q // c.num_heads_kv, axis=1)
        v = np.repeat(inputs["v"].astype(np.float32), c.num_heads_q // c.num_heads_kv, axis=1)
        logits = q @ np.swapaxes(k, -1, -2)
        if c.with_attn_scale:
            logits *= 1.0 / np.sqrt(c.head_dim_qk)
        if c.with_attn_bias:
            logits += inputs["bias"].astype(np.float32)
        keys = np.arange(c.seq_len_k)
        for b in range(c.g):
            last = c.current_seq_len[b] if c.current_seq_len is not None else c.seq_len_k - 1
            limit = np.full(c.seq_len_q, last)
            if c.causal:
                shift = c.prefix_offset[b] if c.prefix_offset is not None else 0
                limit = np.minimum(limit, np.arange(c.seq_len_q) + shift)
            logits[b][:, keys[None, :] > limit[:, None]] = -np.inf
        top = logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits - top)
        total = weights.sum(axis=-1, keepdims=True)
        out = (weights @ v) / total
        lse = (top + np.log(total))[..., 0]
        return out, (lse if c.return_lse else None)
