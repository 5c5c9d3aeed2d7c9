"""The split-KV reference against the exact one (docs/spec.md §3), over the config space and on the
named cases of rocMLIR's split-KV bug history."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from attnconfig import parse_config
from reference import attention_exact, attention_splitkv, combine_unmasked, make_inputs, split_partials, valid_splits

F32_EPS = float(np.finfo(np.float32).eps)


@st.composite
def configs(draw):
    g = draw(st.integers(1, 3))
    sk = draw(st.integers(1, 300))
    kv_cache = draw(st.booleans())
    sq = 1 if kv_cache else draw(st.integers(1, 24))
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2, 4]))
    causal = draw(st.booleans())
    current = [draw(st.integers(0, sk - 1)) for _ in range(g)] if kv_cache else None
    prefix = None
    if causal and draw(st.booleans()):
        prefix = [draw(st.integers(0, sk + 10)) for _ in range(g)]
    split_kv = draw(st.integers(1, 128))
    return parse_config(dict(
        dtype=draw(st.sampled_from(["f16", "bf16", "f32", "i8"])), g=g, seq_len_q=sq, seq_len_k=sk,
        num_heads_q=hq, num_heads_kv=hkv, head_dim_qk=draw(st.integers(1, 24)), head_dim_v=draw(st.integers(1, 24)),
        with_attn_scale=draw(st.booleans()), with_attn_bias=draw(st.booleans()), causal=causal,
        prefix_offset=prefix, current_seq_len=current, return_lse=True, split_kv=split_kv,
        data_seed=draw(st.integers(0, 2**31 - 1)),
    ))


def assert_close_to_exact(c, result, exact_out, exact_lse):
    """Within f32 rounding: O is a convex combination of V rows, LSE carries the logits' scale."""
    v_max = float(np.abs(make_inputs(c)["v"].astype(np.float64)).max())
    np.testing.assert_allclose(result.out_f32, exact_out, rtol=0, atol=64 * F32_EPS * max(v_max, 1e-30))
    finite = np.isfinite(exact_lse)
    assert (np.isfinite(result.lse_f32) == finite).all()
    np.testing.assert_allclose(result.lse_f32[finite], exact_lse[finite], rtol=64 * F32_EPS, atol=64 * F32_EPS)


@given(c=configs(), block_n=st.sampled_from([16, 32, 64, 128]))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_splitkv_equals_exact_and_the_kernel_combine_agrees(c, block_n):
    inputs = make_inputs(c)
    exact_out, exact_lse = attention_exact(c, inputs)
    r = attention_splitkv(c, inputs, block_n)
    S = c.split_kv
    assert r.o_partials.shape == (S, c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v)
    assert r.lse_partials.shape == (S, c.g, c.num_heads_q, c.seq_len_q)
    assert r.o_partials.dtype == np.float32 and r.lse_partials.dtype == np.float32
    for x in (r.out_f32, r.lse_f32, r.o_partials, r.lse_partials, r.out, r.lse):
        assert not np.isnan(np.asarray(x, dtype=np.float64)).any()
    assert np.isfinite(r.lse_f32).all()  # masks always leave key 0 visible
    assert_close_to_exact(c, r, exact_out, exact_lse)
    # Invalid splits are exactly O_s = 0, LSE_s = -inf, so the unmasked combine is the same.
    invalid = np.arange(S)[:, None, None, None] >= r.valid_splits[None]
    assert (r.lse_partials[invalid] == -np.inf).all() and (r.o_partials[invalid] == 0).all()
    assert np.isfinite(r.lse_partials[~invalid]).all()
    out_k, lse_k = combine_unmasked(r.o_partials, r.lse_partials)
    np.testing.assert_allclose(out_k, r.out_f32, rtol=4 * F32_EPS, atol=4 * F32_EPS * max(np.abs(r.out_f32).max(), 1e-30))
    np.testing.assert_allclose(lse_k, r.lse_f32, rtol=F32_EPS, atol=0)


@given(c=configs(), block_n=st.sampled_from([16, 32, 64, 128]))
@settings(max_examples=40, deadline=None)
def test_every_partial_entry_is_written_into_nan_buffers(c, block_n):
    shape = (c.split_kv, c.g, c.num_heads_q, c.seq_len_q)
    o = np.full(shape + (c.head_dim_v,), np.nan, dtype=np.float32)
    lse = np.full(shape, np.nan, dtype=np.float32)
    split_partials(c, make_inputs(c), block_n, o_partials=o, lse_partials=lse)
    assert not np.isnan(o).any() and not np.isnan(lse).any()


def cfg(**kw):
    base = dict(dtype="f32", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=1, num_heads_kv=1,
                head_dim_qk=8, head_dim_v=8, return_lse=True, data_seed=5)
    return parse_config({**base, **kw})


def check_against_exact(c, block_n=32):
    inputs = make_inputs(c)
    exact_out, exact_lse = attention_exact(c, inputs)
    r = attention_splitkv(c, inputs, block_n)
    assert_close_to_exact(c, r, exact_out, exact_lse)
    return r, inputs


# Named regression cases -------------------------------------------------------------------

def test_fewer_key_blocks_than_splits():
    r, _ = check_against_exact(cfg(seq_len_k=8 * 32, split_kv=16, seq_len_q=3))
    assert (r.valid_splits == 8).all()
    assert (r.lse_partials[8:] == -np.inf).all() and (r.o_partials[8:] == 0).all()


def test_sixteen_blocks_eight_splits():
    r, _ = check_against_exact(cfg(seq_len_k=16 * 32, split_kv=8, seq_len_q=3))
    assert (r.valid_splits == 8).all() and np.isfinite(r.lse_partials).all()


def test_twelve_blocks_five_splits_split_four_empty():
    r, _ = check_against_exact(cfg(seq_len_k=12 * 32, split_kv=5, seq_len_q=2))
    assert (r.valid_splits == 4).all()
    assert (r.lse_partials[4] == -np.inf).all() and (r.o_partials[4] == 0).all()


def test_one_block_two_splits_last_split_empty():
    r, _ = check_against_exact(cfg(seq_len_k=20, split_kv=2))
    assert (r.valid_splits == 1).all() and (r.lse_partials[1] == -np.inf).all()


def test_current_seq_len_zero_sees_exactly_key_zero():
    c = cfg(g=2, seq_len_k=300, current_seq_len=[0, 0], split_kv=4, num_heads_q=2)
    r, inputs = check_against_exact(c)
    np.testing.assert_array_equal(r.out_f32[:, :, 0], inputs["v"][:, 0, 0][:, None, :].repeat(2, axis=1))
    assert (r.valid_splits == 1).all()


def test_causal_rows_that_see_a_single_split():
    c = cfg(seq_len_q=128, seq_len_k=128, causal=True, split_kv=4)
    r, _ = check_against_exact(c)
    # 4 blocks, one per split: rows 0..31 see split 0 only, though splits 1-3 hold keys.
    assert (r.valid_splits[0, 0, :32] == 1).all() and (r.valid_splits[0, 0, 96:] == 4).all()
    assert (r.lse_partials[1:, 0, 0, :32] == -np.inf).all()
    assert np.isfinite(r.lse_partials[:, 0, 0, 96:]).all()


def test_prefix_offsets_past_the_end_equal_non_causal():
    base = dict(g=2, seq_len_q=6, seq_len_k=100, split_kv=3)
    past, _ = check_against_exact(cfg(causal=True, prefix_offset=[100, 10_000], **base))
    plain, _ = check_against_exact(cfg(**base))
    np.testing.assert_array_equal(past.out_f32, plain.out_f32)
    np.testing.assert_array_equal(past.valid_splits, plain.valid_splits)


def test_gqa_ratio_64():
    r, inputs = check_against_exact(cfg(num_heads_q=64, num_heads_kv=1, seq_len_q=2, seq_len_k=90, split_kv=3, dtype="f16"))
    assert r.out.shape == (1, 64, 2, 8)


@pytest.mark.parametrize("dim", [1, 1024])
def test_extreme_head_dims(dim):
    check_against_exact(cfg(head_dim_qk=dim, head_dim_v=dim, seq_len_k=70, split_kv=2, dtype="bf16"))


def test_seq_len_one():
    c = cfg(seq_len_q=1, seq_len_k=1, split_kv=8, num_heads_q=2)
    r, inputs = check_against_exact(c)
    np.testing.assert_array_equal(r.out_f32[0, :, 0], inputs["v"][0, 0, 0][None].repeat(2, axis=0))
    assert (r.lse_partials[1:] == -np.inf).all()


@pytest.mark.parametrize("dtype, storage", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_half_precision_combine_in_f32_cast_once(dtype, storage):
    c = cfg(dtype=dtype, seq_len_q=4, seq_len_k=500, split_kv=7)
    r, _ = check_against_exact(c)
    assert r.out.dtype == np.dtype(storage) and r.lse.dtype == np.float32
    assert r.out_f32.dtype == np.float32
    np.testing.assert_array_equal(r.out, r.out_f32.astype(storage))


def test_i8_outputs_are_f16():
    r, _ = check_against_exact(cfg(dtype="i8", seq_len_q=3, seq_len_k=100, split_kv=3, with_attn_bias=True))
    assert r.out.dtype == np.float16 and r.lse.dtype == np.float16


def test_fully_masked_row_by_neg_inf_bias():
    c = cfg(seq_len_q=3, seq_len_k=100, split_kv=3, with_attn_bias=True, causal=True)
    inputs = make_inputs(c)
    inputs["bias"] = inputs["bias"].copy()  # make_inputs hands out read-only arrays
    inputs["bias"][0, 0, 2, :] = -np.inf
    r = attention_splitkv(c, inputs)
    assert (r.out_f32[0, 0, 2] == 0).all() and r.lse_f32[0, 0, 2] == -np.inf
    assert (r.o_partials[:, 0, 0, 2] == 0).all() and (r.lse_partials[:, 0, 0, 2] == -np.inf).all()
    assert not np.isnan(r.o_partials).any() and np.isfinite(r.lse_f32[0, 0, :2]).all()
    out_k, lse_k = combine_unmasked(r.o_partials, r.lse_partials)
    assert (out_k[0, 0, 2] == 0).all() and lse_k[0, 0, 2] == -np.inf


def test_valid_splits_shape_is_per_row():
    c = cfg(g=2, num_heads_q=3, seq_len_q=5, split_kv=2)
    assert valid_splits(c, 32).shape == (2, 3, 5)
