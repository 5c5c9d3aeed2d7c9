"""The host shortcuts of the inputs, the reference and the verifier give the plain computation's bits.

Each shortcut (table widening, integer rounding, cache-sized slices of the metric blocks, results
written in place instead of scattered, row maxima before the division) is pinned here to the
straightforward formula it replaced, bit for bit, on small random cases and on the edges: NaN,
inf and -inf, signed zeros, subnormals, halfway points, fully masked rows, empty splits, every
dtype, bias, causal and prefix-causal masks and ragged KV caches.
"""
import ml_dtypes
import numpy as np
import pytest

import reference.exact as exact_mod
import reference.metrics as metrics
import reference.sliced as sliced
import reference.splits as splits_mod
from attnconfig import parse_config
from reference import (RowScales, attention_lowprec, attention_splitkv, err_ratio, magnitude_reference, make_inputs,
                       partial_metrics, tensor_metrics, verify_outputs)
from reference.chunks import Workspace
from reference.exact import dense_attention
from reference.metrics import _Accumulator, _cast_ref, _row_blocks, _rows_per_block, TINY
from reference.reduce import row_max
from reference.rounding import narrow_f64, round_to
from reference.splits import MaskedWeights
from tests.unit.reference.naive import add_finite, naive_partial_metrics
from reference.widen import widen_into

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(x):
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


# --- widening and rounding ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_widen_is_the_cast_for_every_bit_pattern(dtype):
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    np.testing.assert_array_equal(bits(widen_into(x, np.empty(x.shape, F32))), bits(x.astype(F32)))
    strided = x.reshape(256, 256)[::-3, ::2].T  # a view with odd, negative and transposed strides
    np.testing.assert_array_equal(bits(widen_into(strided, np.empty(strided.shape, F32))), bits(strided.astype(F32)))


def f16_edges(src):
    """Every float16 value, its float32 neighbours, the halfway points and their neighbours, tiny
    and subnormal values, signed zeros: all below 65520, where round_to takes its fast path."""
    h = np.arange(0, 0x7BFF, dtype=np.uint16).view(np.float16).astype(np.float64)
    up = np.nextafter(h.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    ties = (h + up) / 2
    rng = np.random.default_rng(3)
    parts = [h, ties, np.nextafter(ties.astype(src), src(np.inf)), np.nextafter(ties.astype(src), src(0)),
             np.exp(rng.standard_normal(50_000) * 4 - 10), rng.standard_normal(50_000),
             [0.0, 2.0 ** -149, 2.0 ** -126, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -24, 65504.0, 65519.0]]
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]).astype(src)
    return np.concatenate([x, -x])


def test_round_to_float16_fast_path_is_the_cast():
    x = f16_edges(F32)
    assert np.abs(x).max() < 65520
    want = x.astype(np.float16).astype(F32)
    np.testing.assert_array_equal(bits(round_to(x, np.float16)), bits(want))
    y = x.copy()
    round_to(y, np.float16, out=y)  # in place
    np.testing.assert_array_equal(bits(y), bits(want))
    odd = x[:40_000].reshape(200, 200)[:, ::3]  # non-contiguous
    np.testing.assert_array_equal(bits(round_to(odd, np.float16)), bits(odd.astype(np.float16).astype(F32)))


def narrow_hard_values(dtype):
    """float64 values where rounding once and rounding through float32 differ, for `dtype`."""
    info = {np.dtype(np.float16): 0x7BFF, BF16: 0x7F7F}[np.dtype(dtype)]
    v = np.arange(0, info, dtype=np.uint16).view(dtype).astype(np.float64)
    up = np.nextafter(v.astype(dtype), np.array(np.inf, dtype=dtype)).astype(np.float64)
    ties = (v + up) / 2
    rng = np.random.default_rng(7)
    parts = [ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)]
    for rel in (2.0 ** -40, 2.0 ** -30, 2.0 ** -26, 2.0 ** -24):  # below, at and above float32 resolution
        parts += [ties * (1 + rel), ties * (1 - rel)]
    parts += [rng.standard_normal(200_000), rng.standard_normal(20_000) * 2.0 ** rng.integers(-40, 16, 20_000),
              [0.0, 1e-300, 2.0 ** -25, 2.0 ** -24 * 1.5, 65504.0, 65519.99]]
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])
    x = x[np.abs(x) < 65504]  # every value in the fast path's range (float16's; bfloat16's is wider)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_narrow_f64_fast_paths_are_the_cast(dtype):
    x = narrow_hard_values(dtype)
    via_f32 = x.astype(F32).astype(dtype)
    want = x.astype(dtype)
    assert (bits(via_f32) != bits(want)).sum() > 1000  # the values hold double-rounding cases
    work = Workspace()
    for chunk in (1 << 16, 999):  # as make_inputs calls it, and odd lengths
        got = np.empty(x.shape, dtype=dtype)
        for i in range(0, len(x), chunk):
            narrow_f64(x[i:i + chunk], got[i:i + chunk], None, work)
        np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan, 65520.0, -1e6, 1e300])
def test_narrow_f64_float16_with_a_value_it_cannot_round(special):
    x = np.random.default_rng(1).standard_normal(5000)
    x[1234] = special
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
        got = narrow_f64(x, np.empty(x.shape, np.float16))
    np.testing.assert_array_equal(bits(got), bits(want))


# --- verifier metrics ----------------------------------------------------------------------

def blockwise_tensor_metrics(ref, out, row_scale=None):
    """tensor_metrics as it was: whole blocks through naive.add_finite or the masked path."""
    acc, nonfinite = _Accumulator(), 0
    scales = None if row_scale is None else np.asarray(row_scale).reshape(-1)
    step = _rows_per_block(np.shape(out))
    for i, (r_raw, o_raw) in enumerate(_row_blocks(np.asarray(ref), out)):
        scale = None if scales is None else scales[i * step:(i + 1) * step].astype(np.float64)
        if add_finite(acc, _cast_ref(r_raw, out), o_raw.astype(np.float64), scale):
            continue
        r, o = _cast_ref(r_raw, out), o_raw.astype(np.float64)
        r_fin, o_fin = np.isfinite(r), np.isfinite(o)
        nonfinite += int(np.isnan(o).sum() + (np.isinf(o) & r_fin).sum())
        acc.add(r, o, r_fin & o_fin, scale)
    return {"max_abs": acc.max_abs, "max_rel": acc.max_rel, "rms": acc.rms, "row_err": acc.row_err,
            "nonfinite": nonfinite}


def blockwise_err_ratio(ref, out, low):
    """err_ratio as it was."""
    worst_out = worst_low = 0.0
    for r, o_raw, w_raw in _row_blocks(np.asarray(ref), out, low):
        r, o, w = r.astype(np.float64), o_raw.astype(np.float64), w_raw.astype(np.float64)
        if r.size:
            with np.errstate(invalid="ignore"):
                d_out = float(np.abs(np.subtract(o, r, out=o), out=o).max())
                d_low = float(np.abs(np.subtract(w, r, out=w), out=w).max())
            if np.isfinite(d_out) and np.isfinite(d_low):
                worst_out, worst_low = max(worst_out, d_out), max(worst_low, d_low)
                continue
            o, w = o_raw.astype(np.float64), w_raw.astype(np.float64)
        use = np.isfinite(r) & np.isfinite(o) & np.isfinite(w)
        if use.any():
            worst_out = max(worst_out, float(np.abs(o[use] - r[use]).max()))
            worst_low = max(worst_low, float(np.abs(w[use] - r[use]).max()))
    return worst_out / max(worst_low, TINY)


def comparison_case(rng, rows, n, out_dtype, ref_dtype, damage):
    ref = (rng.standard_normal((rows, n)) * 2.0 ** rng.integers(-8, 4)).astype(ref_dtype)
    ref[rng.random((rows, n)) < 0.05] = 0.0  # left out of max_rel
    out = (ref.astype(np.float64) * (1 + 1e-3 * rng.standard_normal((rows, n)))).astype(out_dtype)
    low = (ref.astype(np.float64) * (1 + 1e-3 * rng.standard_normal((rows, n)))).astype(out_dtype)
    scale = np.abs(rng.standard_normal(rows)).astype(F32)
    r, c = rng.integers(rows), rng.integers(n)
    if damage == "nan_out":
        out[r, c] = np.nan
    elif damage == "inf_out":
        out[r, c] = np.inf
    elif damage == "neg_inf_both":
        ref[r, c], out[r, c] = -np.inf, -np.inf
    elif damage == "inf_low":
        low[r, c] = -np.inf
    elif damage == "nan_ref":
        ref[r, c] = np.nan
    elif damage == "scale":
        scale[r], scale[(r + 1) % rows] = np.inf, np.nan
    elif damage == "negative_zero":
        out[ref == 0] = -0.0
    return ref, out, low, scale


@pytest.mark.parametrize("damage", ["none", "nan_out", "inf_out", "neg_inf_both", "inf_low", "nan_ref", "scale",
                                    "negative_zero"])
@pytest.mark.parametrize("out_dtype,ref_dtype", [(np.float16, F32), (BF16, F32), (F32, F32), (F32, np.float64),
                                                 (np.float16, np.float64), (np.float64, np.float64)])
@pytest.mark.parametrize("small", [False, True])
def test_sliced_output_metrics_equal_the_blockwise_ones(monkeypatch, damage, out_dtype, ref_dtype, small):
    if small:  # many blocks of few slices each, the last ones partial
        monkeypatch.setattr(metrics, "_BLOCK_ELEMENTS", 700)
        monkeypatch.setattr(sliced, "SLICE_ELEMENTS", 90)
    rng = np.random.default_rng(abs(hash((damage, str(out_dtype), small))) % 2**32)
    for rows, n in ((61, 40), (300, 3), (1, 1), (7, 1)):
        ref, out, low, scale = comparison_case(rng, rows, n, out_dtype, ref_dtype, damage)
        for row_scale in (None, scale):
            want = blockwise_tensor_metrics(ref, out, row_scale)
            assert tensor_metrics(ref, out, row_scale) == want
            fused, ratio = metrics._compare(ref, out, low, row_scale, stats=True)
            assert fused == want
            want_ratio = blockwise_err_ratio(ref, out, low)
            assert ratio == want_ratio and err_ratio(ref, out, low) == want_ratio


@pytest.mark.parametrize("damage", ["none", "nan_valid", "inf_lse", "nonzero_invalid"])
def test_sliced_partial_metrics_equal_the_plain_formulas(monkeypatch, damage):
    monkeypatch.setattr(sliced, "SLICE_ELEMENTS", 50)  # several slices per split
    c = parse_config(dict(dtype="bf16", g=2, seq_len_q=40, seq_len_k=300, num_heads_q=4, num_heads_kv=2,
                          head_dim_qk=8, head_dim_v=12, causal=True, prefix_offset=[3, 200], return_lse=True,
                          split_kv=4, data_seed=9))
    ref = attention_splitkv(c, make_inputs(c), 32, magnitude=True)
    rng = np.random.default_rng(4)
    o = (ref.o_partials * (1 + 1e-4 * rng.standard_normal(ref.o_partials.shape))).astype(F32)
    lse = ref.lse_partials.copy()
    if damage == "nan_valid":
        o[0, 1, 2, 7, 3] = np.nan
    elif damage == "inf_lse":
        lse[1, 0, 3, 20] = np.inf
    elif damage == "nonzero_invalid":
        o[3, 0, 0, 0, :] = 0.25
    got = partial_metrics(ref.o_partials, ref.lse_partials, ref.valid_splits, o, lse,
                          row_scale=ref.row_scales.partials)
    want = naive_partial_metrics(ref.o_partials, ref.lse_partials, ref.valid_splits, o, lse,
                                 ref.row_scales.partials.astype(np.float64))
    assert got == want


# --- the reference: results written in place, row maxima before the division -----------------

CONFIGS = [
    dict(dtype="f16", g=2, seq_len_q=9, seq_len_k=100, num_heads_q=4, num_heads_kv=4, head_dim_qk=8, head_dim_v=6,
         causal=True, return_lse=True, split_kv=8),  # MHA: in place
    dict(dtype="bf16", g=3, seq_len_q=1, seq_len_k=77, num_heads_q=8, num_heads_kv=2, head_dim_qk=16,
         head_dim_v=5, current_seq_len=[0, 76, 30], return_lse=True, split_kv=2),  # decode: in place
    dict(dtype="f32", g=2, seq_len_q=13, seq_len_k=45, num_heads_q=8, num_heads_kv=2, head_dim_qk=7,
         head_dim_v=9, with_attn_bias=True, causal=True, prefix_offset=[0, 20], return_lse=True, split_kv=4),  # GQA
    dict(dtype="i8", g=2, seq_len_q=5, seq_len_k=64, num_heads_q=2, num_heads_kv=2, head_dim_qk=12, head_dim_v=3,
         with_attn_bias=True, with_attn_scale=False, return_lse=True, split_kv=1),
    dict(dtype="f16", g=1, seq_len_q=70, seq_len_k=33, num_heads_q=1, num_heads_kv=1, head_dim_qk=4, head_dim_v=40,
         causal=True, return_lse=True, split_kv=128),  # most splits empty
    dict(dtype="bf16", g=4, seq_len_q=1, seq_len_k=300, num_heads_q=4, num_heads_kv=1, head_dim_qk=32, head_dim_v=32,
         current_seq_len=[299, 0, 150, 31], causal=True, prefix_offset=[299, 0, 150, 31], return_lse=True, split_kv=1),
]


def _config(fields, seed):
    return parse_config({**fields, "data_seed": seed})


def _masked_row(c, inputs):
    if c.with_attn_bias:  # a fully masked row, as only a -inf bias makes one
        inputs["bias"] = inputs["bias"].copy()  # make_inputs hands out read-only arrays
        inputs["bias"][0, 0, 0, :] = -np.inf
    return inputs


@pytest.mark.parametrize("fields", CONFIGS)
@pytest.mark.parametrize("seed", [1, 2])
def test_splitkv_in_place_equals_scattered(monkeypatch, fields, seed):
    c = _config(fields, seed)
    inputs = _masked_row(c, make_inputs(c))
    for block_n in (16, 32):
        fast = attention_splitkv(c, inputs, block_n, magnitude=True)
        with monkeypatch.context() as m:
            m.setattr(splits_mod, "split_rows_view", lambda *a: None)
            plain = attention_splitkv(c, inputs, block_n, magnitude=True)
        for name in ("out_f32", "lse_f32", "o_partials", "lse_partials", "valid_splits"):
            np.testing.assert_array_equal(bits(getattr(fast, name)), bits(getattr(plain, name)), err_msg=name)
        # The row scales from row maxima divided by l: those of the divided |V| partials.
        separate = RowScales.of(magnitude_reference(c, inputs, block_n))
        np.testing.assert_array_equal(bits(fast.row_scales.out), bits(separate.out))
        np.testing.assert_array_equal(bits(fast.row_scales.partials), bits(separate.partials))


@pytest.mark.parametrize("fields", CONFIGS)
@pytest.mark.parametrize("budget", [1 << 20, 300])  # whole heads, and row blocks of a head
def test_dense_attention_in_place_equals_scattered(monkeypatch, fields, budget):
    c = _config(fields, 3)
    inputs = _masked_row(c, make_inputs(c))
    for compute, p_dtype in ((np.dtype(np.float64), None), (np.dtype(F32), np.dtype(np.float16)),
                             (np.dtype(F32), BF16), (np.dtype(F32), None)):
        fast = dense_attention(c, inputs, compute, p_dtype, budget)
        with monkeypatch.context() as m:
            m.setattr(exact_mod, "rows_view", lambda *a: None)
            plain = dense_attention(c, inputs, compute, p_dtype, budget)
        np.testing.assert_array_equal(bits(fast[0]), bits(plain[0]))
        np.testing.assert_array_equal(bits(fast[1]), bits(plain[1]))


@pytest.mark.parametrize("fields", CONFIGS)
def test_lowprec_as_float32_holds_the_same_values(fields):
    c = _config(fields, 4)
    inputs = _masked_row(c, make_inputs(c))
    stored = attention_lowprec(c, inputs)
    held = attention_lowprec(c, inputs, as_float32=True)
    assert held.dtype == F32
    np.testing.assert_array_equal(bits(held), bits(stored.astype(F32)))
    # ... and the verifier gives the same metrics with either.
    ref = attention_splitkv(c, inputs, 32, magnitude=True)
    out = ref.out
    assert (verify_outputs(c, ref, stored, out, ref.lse, ref.o_partials, ref.lse_partials, magnitude=ref.row_scales)
            == verify_outputs(c, ref, held, out, ref.lse, ref.o_partials, ref.lse_partials, magnitude=ref.row_scales))


def test_combine_row_max_equals_the_row_max_of_the_combine():
    rng = np.random.default_rng(8)
    S, rows, dv = 7, 50, 9
    o = np.abs(rng.standard_normal((S, rows, dv))).astype(F32)
    o[:, 3] = 0.0
    lse = rng.standard_normal((S, rows)).astype(F32)
    lse[:, 4] = -np.inf  # no weight at all: 0
    valid = rng.integers(0, 5, size=rows)  # 0: no valid split
    w = MaskedWeights(lse, valid)
    np.testing.assert_array_equal(bits(w.combine_row_max(o)), bits(row_max(w.combine(o))))
