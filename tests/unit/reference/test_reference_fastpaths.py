"""The fast paths of the host reference give what the plain formulas give.

The reference shares one split pass between V and |V|, skips splits no row may see in the
combine, and takes finite blocks of the metrics without masks: each is checked here against
the straightforward computation it replaced, bit for bit where the arithmetic is the same.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from attnconfig import parse_config
from reference import (
    RowScales,
    attention_splitkv,
    combine_masked,
    magnitude_reference,
    make_inputs,
    partial_metrics,
    split_partials,
    tensor_metrics,
    valid_splits,
)
from reference.chunks import Workspace
from reference.metrics import _Accumulator
from reference.sliced import compare_block
from tests.unit.reference.naive import naive_partial_metrics

F32 = np.float32


@st.composite
def configs(draw):
    g = draw(st.integers(1, 3))
    sk = draw(st.integers(1, 200))
    kv_cache = draw(st.booleans())
    hkv = draw(st.sampled_from([1, 2]))
    causal = draw(st.booleans())
    return parse_config(dict(
        dtype=draw(st.sampled_from(["f16", "bf16", "f32", "i8"])), g=g,
        seq_len_q=1 if kv_cache else draw(st.integers(1, 20)), seq_len_k=sk,
        num_heads_q=hkv * draw(st.sampled_from([1, 2, 4])), num_heads_kv=hkv,
        head_dim_qk=draw(st.integers(1, 20)), head_dim_v=draw(st.integers(1, 20)),
        with_attn_scale=draw(st.booleans()), with_attn_bias=draw(st.booleans()), causal=causal,
        prefix_offset=[draw(st.integers(0, sk)) for _ in range(g)] if causal and draw(st.booleans()) else None,
        current_seq_len=[draw(st.integers(0, sk - 1)) for _ in range(g)] if kv_cache else None,
        return_lse=True, split_kv=draw(st.sampled_from([1, 2, 3, 8, 64])), data_seed=draw(st.integers(0, 2**31 - 1)),
    ))


def naive_combine_masked(o_partials, lse_partials, valid):
    """The reference combine as first written: every split, masks everywhere."""
    S = lse_partials.shape[0]
    is_valid = np.arange(S).reshape((S,) + (1,) * valid.ndim) < valid[None]
    lse_v = np.where(is_valid, lse_partials, F32(-np.inf)).astype(F32)
    top = lse_v.max(axis=0)
    top_safe = np.where(top == -np.inf, F32(0), top)
    with np.errstate(divide="ignore"):
        weights = np.where(is_valid, np.exp(lse_v - top_safe), F32(0)).astype(F32)
        # In split order, as the reference adds them: weights.sum(axis=0) sums pairwise when the
        # rows are few (numpy then reduces along the split axis), another rounding.
        denom = np.zeros(weights.shape[1:], dtype=F32)
        for w in weights:
            denom += w
        num = np.zeros(o_partials.shape[1:], dtype=F32)
        for s in range(S):
            num += np.where(is_valid[s][..., None], weights[s][..., None] * o_partials[s], F32(0))
        out = np.where(denom[..., None] > 0, num / np.where(denom > 0, denom, F32(1))[..., None], F32(0))
        lse = np.where(denom > 0, top_safe + np.log(denom), F32(-np.inf))
    return out.astype(F32), lse.astype(F32)


@given(c=configs(), block_n=st.sampled_from([16, 32]))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fused_reference_equals_separate_passes_bit_for_bit(c, block_n):
    inputs = make_inputs(c)
    fused = attention_splitkv(c, inputs, block_n, magnitude=True)
    o_p, lse_p = split_partials(c, inputs, block_n)
    valid = valid_splits(c, block_n)
    out, lse = naive_combine_masked(o_p, lse_p, valid)
    np.testing.assert_array_equal(fused.o_partials, o_p)
    np.testing.assert_array_equal(fused.lse_partials, lse_p)
    np.testing.assert_array_equal(fused.out_f32, out)
    np.testing.assert_array_equal(fused.lse_f32, lse)
    np.testing.assert_array_equal(fused.out_f32, combine_masked(o_p, lse_p, valid)[0])
    # The |V| row scales from the shared pass equal those of a second reference on |V|.
    separate = RowScales.of(magnitude_reference(c, inputs, block_n))
    np.testing.assert_array_equal(fused.row_scales.out, separate.out)
    np.testing.assert_array_equal(fused.row_scales.partials, separate.partials)


def test_combine_skips_only_splits_nobody_sees():
    rng = np.random.default_rng(0)
    S, rows, dv = 6, 40, 5
    o = rng.standard_normal((S, rows, dv)).astype(F32)
    lse = rng.standard_normal((S, rows)).astype(F32)
    valid = rng.integers(1, 4, size=rows)  # splits 3.. never valid, 0 always
    o[4] = np.nan  # never read, as the masked formula never uses it
    out, l = combine_masked(o, lse, valid)
    ref_out, ref_l = naive_combine_masked(o, lse, valid)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(l, ref_l)


def _masked_only(ref, out, scale=None):
    acc = _Accumulator()
    r, o = ref.astype(out.dtype).astype(np.float64), out.astype(np.float64)
    acc.add(r, o, np.isfinite(r) & np.isfinite(o), scale)
    return acc


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_finite_fast_path_matches_the_masked_path(dtype):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((30, 17)).astype(F32)
    ref[3, 4] = 0.0  # left out of max_rel either way
    out = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(dtype)
    scale = np.abs(rng.standard_normal(30))
    slow = _masked_only(ref, out, scale)
    fast = _Accumulator()
    block, _ = compare_block(ref, out, None, scale, out.dtype, True, Workspace())
    fast.add_block(block)
    for key in ("count", "max_abs", "max_mag", "max_rel", "row_err"):
        assert getattr(fast, key) == getattr(slow, key), key
    assert fast.sq_sum == pytest.approx(slow.sq_sum, rel=1e-12)
    bad = out.copy()
    bad[2, 2] = np.inf
    assert compare_block(ref, bad, None, scale, bad.dtype, True, Workspace())[0] is None
    m = tensor_metrics(ref, bad)
    assert m["nonfinite"] == 1 and np.isfinite(m["rms"])


@pytest.mark.parametrize("damage", ["none", "nan_valid", "nan_invalid", "nonzero_invalid", "inf_lse",
                                    "negative_zero_invalid", "negative_zero_and_nonzero_invalid"])
def test_partial_metrics_match_the_plain_formulas(damage):
    c = parse_config(dict(dtype="f16", g=2, seq_len_q=9, seq_len_k=100, num_heads_q=4, num_heads_kv=2,
                          head_dim_qk=8, head_dim_v=6, causal=True, return_lse=True, split_kv=8, data_seed=5))
    ref = attention_splitkv(c, make_inputs(c), 16, magnitude=True)
    rng = np.random.default_rng(2)
    o = (ref.o_partials + 1e-4 * rng.standard_normal(ref.o_partials.shape) * (ref.o_partials != 0)).astype(F32)
    lse = ref.lse_partials.copy()
    if damage == "nan_valid":
        o[0, 1, 2, 3, 1] = np.nan
    elif damage == "nan_invalid":
        o[7, 0, 0, 0, 0] = np.nan
    elif damage == "nonzero_invalid":
        o[6, 1, 3, 0, 2] = 0.5
    elif damage == "inf_lse":
        lse[0, 0, 1, 4] = np.inf
    elif damage.startswith("negative_zero"):  # -0.0 is a zero: not bad, though its bits are not 0
        o[5] = -0.0
        if damage.endswith("nonzero_invalid"):
            o[5, 1, 2, 8, 5] = -1e-30
    got = partial_metrics(ref.o_partials, ref.lse_partials, ref.valid_splits, o, lse,
                          row_scale=ref.row_scales.partials)
    want = naive_partial_metrics(ref.o_partials, ref.lse_partials, ref.valid_splits, o, lse,
                                 ref.row_scales.partials.astype(np.float64))
    assert got == want
    assert (got["nonfinite"] > 0) == (damage in ("nan_valid", "nan_invalid", "inf_lse"))
    assert (got["invalid_bad"] > 0) == (damage in ("nan_invalid", "nonzero_invalid", "negative_zero_and_nonzero_invalid"))
