"""The host-side shortcuts of a config's inputs and verify, each against what it replaced.

    .venv/bin/python -m bench.host_casts

One process, interleaved: per element, the plain operation and its replacement on the same data,
and their ratio (plain / new; above 1 the replacement is faster). Both give the same bytes
(tests/unit/reference/test_inputs_bytes.py, test_reference_fastpaths.py); this only times them.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ml_dtypes
import numpy as np

from attnconfig import parse_config
from reference import make_inputs
from reference.metrics import _all_positive_zero
from reference.rounding import narrow_f64

CHUNK = 1 << 16  # make_inputs' draw chunk


def per_element(fn, n: int, repeat: int = 5, inner: int = 20) -> float:
    """Best of `repeat` timings of `inner` calls, in ns per element."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best / n * 1e9


def plain_inputs(c):
    rng = np.random.default_rng(c.data_seed)
    dtype = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}[c.dtype]
    shapes = [(c.g, c.num_heads_q, c.seq_len_q, c.head_dim_qk), (c.g, c.num_heads_kv, c.seq_len_k, c.head_dim_qk),
              (c.g, c.num_heads_kv, c.seq_len_k, c.head_dim_v)]
    if c.with_attn_bias:
        shapes.append((c.g, c.num_heads_q, c.seq_len_q, c.seq_len_k))
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(CHUNK)
    scratch = np.empty(CHUNK, dtype=np.float32)
    draw_buf = np.empty(CHUNK)
    rows = [("draw one f64 normal (not replaced)", per_element(lambda: rng.standard_normal(out=draw_buf), CHUNK), None)]
    for name, dtype in (("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        out = np.empty(CHUNK, dtype=dtype)
        old = per_element(lambda: out.__setitem__(Ellipsis, x), CHUNK)
        new = per_element(lambda: narrow_f64(x, out, scratch), CHUNK)
        rows.append((f"f64 -> {name}: astype vs narrow_f64", old, new))
    zeros = np.zeros((1 << 20) // 128 * 128, dtype=np.float32).reshape(-1, 128)
    rows.append(("empty split block: count_nonzero vs bits max", per_element(lambda: np.count_nonzero(zeros), zeros.size),
                 per_element(lambda: _all_positive_zero(zeros), zeros.size)))
    for dtype in ("bf16", "f16", "f32"):
        c = parse_config(dict(dtype=dtype, g=2, seq_len_q=256, seq_len_k=2048, num_heads_q=8, num_heads_kv=2,
                              head_dim_qk=128, head_dim_v=128, with_attn_bias=True, data_seed=3))
        n = sum(a.size for a in plain_inputs(c))
        rows.append((f"inputs of a {dtype} config with bias: plain vs make_inputs",
                     per_element(lambda: plain_inputs(c), n, repeat=3, inner=1),
                     per_element(lambda: make_inputs(c), n, repeat=3, inner=1)))
    print(f"{'operation':62s} {'plain ns':>9s} {'new ns':>8s} {'ratio':>6s}")
    for label, old, new in rows:
        tail = f"{new:8.2f} {old / new:6.2f}" if new is not None else ""
        print(f"{label:62s} {old:9.2f} {tail}")


if __name__ == "__main__":
    main()
