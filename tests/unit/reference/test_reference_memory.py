"""The reference stays within bounded memory on big configs the prefilters accept (docs/spec.md §6)."""
import tracemalloc

import numpy as np

from attnconfig import parse_config
from reference import attention_exact, make_inputs

GIB = 1 << 30


def test_exact_reference_peak_memory_is_bounded():
    # 16k x 16k logits: 2 GiB in float64 if materialised; accepted by every docs/spec.md §6 prefilter
    # (reference_flops = 16384^2 * (2 * (4 + 4) + 8) = 6.4e9, reference_bytes ~ 1 MiB).
    c = parse_config(dict(dtype="f16", g=1, seq_len_q=16384, seq_len_k=16384, num_heads_q=1, num_heads_kv=1,
                          head_dim_qk=4, head_dim_v=4, causal=True))
    inputs = make_inputs(c)
    tracemalloc.start()
    try:
        out, lse = attention_exact(c, inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    assert peak < 2 * GIB
    assert peak < 256 << 20  # chunked: far below even one logits matrix
