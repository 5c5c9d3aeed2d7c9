"""The exact reference against an independent implementation, feature by feature.

O is checked against torch's scaled_dot_product_attention in float64 (explicit boolean or
additive mask, enable_gqa=True); LSE against torch.logsumexp of logits built with torch ops.
Neither shares code with reference/.
"""
import math
import threading

import numpy as np
import pytest
import torch

from attnconfig import parse_config
from reference import attention_exact, attention_lowprec, make_inputs
from reference.chunks import DEFAULT_BUDGET
from reference.exact import dense_attention

BASE = dict(dtype="f32", g=2, seq_len_q=9, seq_len_k=70, num_heads_q=4, num_heads_kv=2,
            head_dim_qk=16, head_dim_v=12, data_seed=3)


def cfg(**kw):
    return parse_config({**BASE, **kw})


def t64(x):
    return torch.from_numpy(np.asarray(x).astype(np.float64))


def torch_attention(c, inputs):
    """(out, lse) from torch alone, following docs/spec.md §1-§2 as written."""
    q, k, v = t64(inputs["q"]), t64(inputs["k"]), t64(inputs["v"])
    g, sq, sk = c.g, c.seq_len_q, c.seq_len_k
    rows = torch.arange(sq)[:, None]
    keys = torch.arange(sk)[None, :]
    allowed = torch.ones(g, 1, sq, sk, dtype=torch.bool)
    for b in range(g):
        if c.current_seq_len is not None:
            allowed[b, 0] &= keys <= c.current_seq_len[b]
        if c.causal:
            offset = c.prefix_offset[b] if c.prefix_offset is not None else 0
            allowed[b, 0] &= keys <= rows + offset
    scale = 1 / math.sqrt(c.head_dim_qk) if c.with_attn_scale else 1.0
    additive = torch.zeros(g, c.num_heads_q, sq, sk, dtype=torch.float64)
    if c.with_attn_bias:
        additive = additive + t64(inputs["bias"])
    if c.dtype == "i8":
        # logits = (QK^T - zp) * qs * scale + bias  ==  QK^T * (qs * scale) + (bias - zp * qs * scale)
        sdpa_scale = inputs["quant_scale"] * scale
        additive = additive - inputs["quant_zero_point"] * sdpa_scale
    else:
        sdpa_scale = scale
    mask = additive.masked_fill(~allowed, -math.inf)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sdpa_scale, enable_gqa=True)
    ratio = c.num_heads_q // c.num_heads_kv
    # Elementwise products summed, not a matmul: LSE then shares no BLAS call with SDPA or ours.
    dots = (q[..., :, None, :] * k.repeat_interleave(ratio, dim=1)[..., None, :, :]).sum(-1)
    logits = dots * sdpa_scale + mask
    return out.numpy(), torch.logsumexp(logits, dim=-1).numpy()


FEATURES = {
    "plain": {},
    "no_scale": dict(with_attn_scale=False),
    "bias": dict(with_attn_bias=True),
    "kv_cache": dict(seq_len_q=1, current_seq_len=[0, 41]),
    "causal": dict(causal=True),
    "causal_square": dict(causal=True, seq_len_q=70),
    "prefix_causal": dict(causal=True, prefix_offset=[0, 33]),
    "prefix_causal_kv_cache": dict(causal=True, seq_len_q=5, prefix_offset=[12, 60], current_seq_len=[12, 60]),
    "gqa_4": dict(num_heads_q=8, num_heads_kv=2),
    "mqa": dict(num_heads_q=4, num_heads_kv=1),
    "everything": dict(with_attn_bias=True, with_attn_scale=False, causal=True, prefix_offset=[3, 7],
                       current_seq_len=[50, 9], num_heads_q=8, num_heads_kv=2),
}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "i8"])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_exact_matches_torch_sdpa(dtype, feature):
    c = cfg(dtype=dtype, **FEATURES[feature])
    inputs = make_inputs(c)
    out, lse = attention_exact(c, inputs)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    assert out.shape == (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v) and lse.shape == out.shape[:3]
    want_out, want_lse = torch_attention(c, inputs)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12, err_msg=repeat_gaps(c, inputs, out, want_out, 0))
    np.testing.assert_allclose(lse, want_lse, rtol=1e-13, atol=1e-12, err_msg=repeat_gaps(c, inputs, lse, want_lse, 1))


def repeat_gaps(c, inputs, ours, theirs, which):
    """On a mismatch, whether each side gives the same bits again in this process, and whether
    the inputs still hold what make_inputs draws.

    Two float64 implementations agree to about 1e-15 here, whatever the thread counts or the
    FPU's rounding mode; one float32 ulp in one bias element of the `bias` case moves an LSE by
    1.4e-10. So a gap of that size means the two sides read different inputs: a side whose
    repeat differs is not deterministic in this process, and inputs that differ from a fresh
    draw were written into after make_inputs handed them out."""
    if np.allclose(ours, theirs, rtol=1e-13, atol=1e-12):
        return ""
    again_ours, again_theirs = attention_exact(c, inputs)[which], torch_attention(c, inputs)[which]
    gap = lambda a, b: float(np.nanmax(np.abs(a - b)))
    fresh = make_inputs(c)
    changed = {k: int(np.count_nonzero(np.asarray(v) != np.asarray(fresh[k]))) for k, v in inputs.items()
               if isinstance(v, np.ndarray)}
    others = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    return (f"repeated in this process: ours moved by {gap(ours, again_ours):.3g}, torch by "
            f"{gap(theirs, again_theirs):.3g}; torch threads {torch.get_num_threads()}; elements that differ "
            f"from a fresh make_inputs: {changed}; other threads alive (a writer left by an earlier test?): {others}")


@pytest.mark.parametrize("budget", [1, 97, 5000])
def test_chunking_does_not_change_the_result(budget):
    c = cfg(dtype="f16", g=3, seq_len_q=20, with_attn_bias=True, causal=True, prefix_offset=[0, 5, 60],
            num_heads_q=8, num_heads_kv=2)
    inputs = make_inputs(c)
    whole = dense_attention(c, inputs, np.dtype(np.float64), budget=DEFAULT_BUDGET)
    cut = dense_attention(c, inputs, np.dtype(np.float64), budget=budget)
    np.testing.assert_allclose(cut[0], whole[0], rtol=0, atol=1e-14)
    np.testing.assert_allclose(cut[1], whole[1], rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
def test_fully_masked_row_by_neg_inf_bias_gives_zero_and_neg_inf(dtype):
    c = cfg(dtype=dtype, with_attn_bias=True)
    inputs = make_inputs(c)
    inputs["bias"] = inputs["bias"].copy()  # make_inputs hands out read-only arrays
    inputs["bias"][1, 3, 4, :] = -np.inf
    out, lse = attention_exact(c, inputs)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[1, 3, 4] == 0).all() and lse[1, 3, 4] == -np.inf
    assert np.isfinite(lse[1, 3, :4]).all() and (np.abs(out[1, 2]).sum() > 0)
    low = attention_lowprec(c, inputs)
    assert (low[1, 3, 4] == 0).all() and not np.isnan(low.astype(np.float64)).any()


def test_kv_cache_of_one_key_returns_that_value_row():
    c = cfg(seq_len_q=1, current_seq_len=[0, 0], num_heads_q=4, num_heads_kv=2)
    inputs = make_inputs(c)
    out, _ = attention_exact(c, inputs)
    for h in range(4):
        np.testing.assert_array_equal(out[:, h, 0], inputs["v"][:, h // 2, 0].astype(np.float64))


def test_lowprec_is_close_to_exact_but_not_equal():
    c = cfg(dtype="f16", seq_len_k=700)
    inputs = make_inputs(c)
    low = attention_lowprec(c, inputs)
    exact, _ = attention_exact(c, inputs)
    assert low.dtype == np.float16
    err = np.abs(low.astype(np.float64) - exact).max()
    assert 0 < err < 5e-3
