"""The reference's elementwise shortcuts give the same bits as the plain operations they replace.

Reproducers and stored metrics depend on the reference being bit-for-bit stable, so each
shortcut is compared bitwise (signs of zeros included) with the plain computation.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import reference.splits as splits
from reference import attention_splitkv, make_inputs, split_partials
from reference.chunks import Workspace, add_widened
from attnconfig import parse_config
from reference.reduce import row_max

F32 = np.float32


@st.composite
def configs(draw):
    """Small configs with many splits, masks and biases: every path of split_pieces."""
    g, sk = draw(st.integers(1, 2)), draw(st.integers(1, 150))
    causal = draw(st.booleans())
    hkv = draw(st.sampled_from([1, 2]))
    return parse_config(dict(
        dtype=draw(st.sampled_from(["f16", "bf16", "f32", "i8"])), g=g, seq_len_q=draw(st.integers(1, 12)),
        seq_len_k=sk, num_heads_q=hkv * draw(st.sampled_from([1, 4])), num_heads_kv=hkv,
        head_dim_qk=draw(st.integers(1, 12)), head_dim_v=draw(st.integers(1, 40)),
        with_attn_bias=draw(st.booleans()), causal=causal,
        prefix_offset=[draw(st.integers(0, sk)) for _ in range(g)] if causal and draw(st.booleans()) else None,
        current_seq_len=[draw(st.integers(0, sk - 1)) for _ in range(g)] if draw(st.booleans()) else None,
        return_lse=True, split_kv=draw(st.sampled_from([1, 2, 3, 64])), data_seed=draw(st.integers(0, 2**31 - 1)),
    ))


def bits(x):
    x = np.ascontiguousarray(x)
    return x.view(f"u{x.dtype.itemsize}")


@pytest.mark.parametrize("n", [1, 2, 3, 7, 32, 33, 100])
@pytest.mark.parametrize("rows", [3, 5000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_max_equals_numpy_max(n, rows, dtype):
    rng = np.random.default_rng(n * rows)
    x = rng.standard_normal((2, rows, n)).astype(dtype)
    x[0, 0] = -np.inf                       # a fully masked row
    x[1, 1, n // 2] = np.inf
    np.testing.assert_array_equal(bits(row_max(x)), bits(x.max(axis=-1)))
    out = np.empty(x.shape[:-1], dtype)
    assert row_max(x[..., ::-1], out=out) is out
    np.testing.assert_array_equal(bits(out), bits(x.max(axis=-1)))
    x[1, 2, 0] = np.nan
    assert np.isnan(row_max(x)[1, 2])


@pytest.mark.parametrize("src_type", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("dst_type", [np.float32, np.float64])
def test_add_widened_equals_a_mixed_type_add(src_type, dst_type):
    rng = np.random.default_rng(1)
    src = rng.standard_normal((3, 40, 17)).astype(src_type).transpose(1, 0, 2)[:, :, 2:14]  # strided
    src[0, 0, :3] = [-np.inf, -0.0, 0.0]
    dst = rng.standard_normal(src.shape).astype(dst_type)
    dst[0, 0, 1:3] = [0.0, -0.0]
    expected = dst + src.astype(dst_type)
    work = Workspace()
    add_widened(dst, src, work)
    np.testing.assert_array_equal(bits(dst), bits(expected))


def test_first_tile_turns_negative_zero_sums_into_positive_zero():
    # The plain update is (0 * alpha) + pv: a -0 in pv comes out +0.
    acc = np.full((1, 3, 2), np.nan, F32)
    pv = np.array([[[-0.0, 1.5], [0.0, -2.0], [-0.0, -0.0]]], F32)
    splits._accumulate(acc, pv, np.zeros((1, 3), F32), first_tile=True)
    plain = np.zeros_like(pv) * F32(0) + pv
    np.testing.assert_array_equal(bits(acc), bits(plain))
    assert not np.signbit(acc[0, 0, 0])


def _plain_accumulate(acc, pv, alpha, first_tile):
    acc *= alpha[..., None]
    acc += pv


class _ZeroedWorkspace(Workspace):
    """Hands out zero-filled buffers, as the zero fill before the first tile did."""

    def take(self, name, shape, dtype):
        buffer = super().take(name, shape, dtype)
        buffer.fill(0)
        return buffer


@given(c=configs(), block_n=st.sampled_from([16, 32]))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_first_tile_shortcut_equals_the_plain_online_softmax(c, block_n):
    inputs = make_inputs(c)
    fast = attention_splitkv(c, inputs, block_n, magnitude=True)
    fast_kernel = split_partials(c, inputs, block_n, p_dtype=np.dtype(np.float16))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(splits, "_accumulate", _plain_accumulate)
        mp.setattr(splits, "Workspace", _ZeroedWorkspace)
        plain = attention_splitkv(c, inputs, block_n, magnitude=True)
        plain_kernel = split_partials(c, inputs, block_n, p_dtype=np.dtype(np.float16))
    for a, b in [(fast.o_partials, plain.o_partials), (fast.lse_partials, plain.lse_partials),
                 (fast.out_f32, plain.out_f32), (fast.lse_f32, plain.lse_f32),
                 (fast.row_scales.out, plain.row_scales.out), (fast.row_scales.partials, plain.row_scales.partials),
                 *zip(fast_kernel, plain_kernel)]:
        np.testing.assert_array_equal(bits(a), bits(b))
