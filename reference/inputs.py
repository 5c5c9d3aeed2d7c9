"""Input tensors of a config (docs/spec.md §1 "Inputs") and the storage types of every tensor.

Same config, same bytes: the reference, every backend and every reproducer draw through
this one function, so a failure seen on one machine replays bit for bit on another.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from attnconfig import AttentionConfig, parse_config
from reference.chunks import Workspace
from reference.normals import draw_normals
from reference.regimes import apply_regime

_FLOAT_STORAGE = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}


def as_config(config: AttentionConfig | Mapping[str, Any]) -> AttentionConfig:
    return parse_config(config)


def qk_dtype(dtype: str) -> np.dtype:
    """Storage type of Q and K."""
    return np.dtype(np.int8) if dtype == "i8" else _FLOAT_STORAGE[dtype]


def value_dtype(dtype: str) -> np.dtype:
    """Storage type of V and bias (f16 for i8: only Q and K are quantised)."""
    return np.dtype(np.float16) if dtype == "i8" else _FLOAT_STORAGE[dtype]


def output_dtypes(config: AttentionConfig | Mapping[str, Any] | str) -> tuple[np.dtype, np.dtype]:
    """(O, LSE) storage types a kernel returns: f16/f16 for i8, else (storage dtype, f32)."""
    dtype = config if isinstance(config, str) else as_config(config).dtype
    if dtype == "i8":
        return np.dtype(np.float16), np.dtype(np.float16)
    return _FLOAT_STORAGE[dtype], np.dtype(np.float32)


def softmax_scale(c: AttentionConfig) -> float:
    return 1.0 / math.sqrt(c.head_dim_qk) if c.with_attn_scale else 1.0


def make_inputs(config: AttentionConfig | Mapping[str, Any]) -> dict[str, Any]:
    """q, k, v (and bias, quant_scale, quant_zero_point where they apply), logical layouts,
    in the config's data regime (reference/regimes.py); the arrays are read-only."""
    c = as_config(config)
    rng = np.random.default_rng(c.data_seed)
    g, hq, hkv, sq, sk = c.g, c.num_heads_q, c.num_heads_kv, c.seq_len_q, c.seq_len_k
    shapes = {"q": (g, hq, sq, c.head_dim_qk), "k": (g, hkv, sk, c.head_dim_qk), "v": (g, hkv, sk, c.head_dim_v)}
    work = Workspace()  # the fallback draw's and the regimes' chunk-sized scratch, for every tensor

    def normal(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        # Rounded once to the storage type as they are drawn (reference/normals.py): the same
        # values as standard_normal(shape).astype(dtype), with no float64 tensor.
        return draw_normals(rng, np.empty(shape, dtype=dtype), work)

    out: dict[str, Any] = {}
    if c.dtype == "i8":
        out["q"] = rng.integers(-8, 7, size=shapes["q"], endpoint=True, dtype=np.int8)
        out["k"] = rng.integers(-8, 7, size=shapes["k"], endpoint=True, dtype=np.int8)
    else:
        out["q"] = normal(shapes["q"], qk_dtype(c.dtype))
        out["k"] = normal(shapes["k"], qk_dtype(c.dtype))
    out["v"] = normal(shapes["v"], value_dtype(c.dtype))
    if c.with_attn_bias:
        out["bias"] = normal((g, hq, sq, sk), value_dtype(c.dtype))
    if c.dtype == "i8":
        out["quant_zero_point"] = int(rng.integers(-4, 4, endpoint=True))
        out["quant_scale"] = 1.0 / (8.0 * math.sqrt(c.head_dim_qk))
    # A regime reshapes the normal draws (and draws nothing from this stream), so the stream
    # and every normal config's bytes stay as they are.
    apply_regime(c, out, work)
    # Read by a device thread and the host reference at once (sweeps/runner.py): a write into
    # them would be a bug, so it raises.
    for name in ("q", "k", "v", "bias"):
        if name in out:
            out[name].flags.writeable = False
    return out
