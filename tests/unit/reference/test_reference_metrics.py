"""Verifier metrics (docs/spec.md §4)."""
import math

import ml_dtypes
import numpy as np
import pytest

from attnconfig import parse_config
from attnconfig.outcomes import METRIC_KEYS
from reference import (attention_exact, attention_lowprec, attention_splitkv, err_ratio, lse_metrics, make_inputs,
                       tensor_metrics, verify_outputs)


def test_rms_formula_by_hand():
    ref = np.array([[1.0, -2.0], [0.5, 4.0]])
    out = np.array([[1.0, -2.5], [0.5, 3.0]])
    m = tensor_metrics(ref, out)
    assert m["max_abs"] == 1.0
    assert m["rms"] == pytest.approx(math.sqrt(0.25 + 1.0) / (4.0 * math.sqrt(4)))
    assert m["max_rel"] == pytest.approx(0.25)
    assert m["row_err"] == pytest.approx(max(0.5 / 2.5, 1.0 / 4.0))
    assert m["nonfinite"] == 0


def test_identical_zero_tensors_have_zero_metrics():
    z = np.zeros((3, 4), dtype=np.float16)
    m = tensor_metrics(z.astype(np.float64), z)
    assert m == {"max_abs": 0.0, "max_rel": 0.0, "rms": 0.0, "row_err": 0.0, "nonfinite": 0}


def test_max_rel_leaves_out_zero_reference_elements():
    m = tensor_metrics(np.array([0.0, 2.0]), np.array([1.0, 2.2]))
    assert m["max_rel"] == pytest.approx(0.1)
    assert m["max_abs"] == pytest.approx(1.0)


def test_one_wrong_row_in_ten_thousand_shows_in_row_err_not_rms():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((10_000, 64))
    out = ref.astype(np.float32)
    out[4321] = rng.standard_normal(64)
    m = tensor_metrics(ref, out)
    assert m["row_err"] > 0.5
    assert m["rms"] < 0.005  # below every RMS threshold of docs/spec.md §5


def test_correct_rounding_of_the_reference_gives_tiny_metrics():
    c = parse_config(dict(dtype="bf16", g=2, seq_len_q=20, seq_len_k=300, num_heads_q=4, num_heads_kv=2,
                          head_dim_qk=32, head_dim_v=32, return_lse=True, split_kv=3))
    inputs = make_inputs(c)
    exact_out, _ = attention_exact(c, inputs)
    for storage in (np.float16, ml_dtypes.bfloat16):
        rounded = exact_out.astype(storage)
        m = tensor_metrics(exact_out, rounded)
        assert m["max_abs"] == 0 and m["rms"] == 0 and m["row_err"] == 0  # ref is cast first
        # Against the f32 split-KV reference the rounding is one ulp at most.
        ulp = 2.0 ** -7 if storage is ml_dtypes.bfloat16 else 2.0 ** -10
        r = attention_splitkv(c, inputs)
        m32 = tensor_metrics(r.out_f32, rounded)
        assert m32["row_err"] <= ulp and m32["rms"] < ulp / 4
    low = attention_lowprec(c, inputs)
    ratio = err_ratio(exact_out, exact_out.astype(ml_dtypes.bfloat16), low)
    assert 0 < ratio <= 1.0


def test_lse_matched_neg_inf_excluded_and_mismatch_counted():
    ref = np.array([[-np.inf, 1.0, 2.0], [3.0, -np.inf, 4.0]])
    out = np.array([[-np.inf, 1.0, 2.0], [3.0, -np.inf, 4.0]], dtype=np.float32)
    m = lse_metrics(ref, out)
    assert m["max_abs"] == 0 and m["rms"] == 0 and m["inf_mismatch"] == 0 and m["nonfinite"] == 0
    out[0, 1] = -np.inf  # finite in the reference
    out[1, 1] = 7.0      # -inf in the reference
    out[1, 2] = 4.5
    m = lse_metrics(ref, out)
    assert m["inf_mismatch"] == 2
    assert m["nonfinite"] == 1  # the -inf where the reference is finite
    assert m["max_abs"] == pytest.approx(0.5)
    assert m["rms"] == pytest.approx(0.5 / (4.5 * math.sqrt(3)))  # over the 3 finite pairs


def test_nan_in_output_is_counted():
    ref = np.ones((2, 3))
    out = np.ones((2, 3), dtype=np.float16)
    out[1, 2] = np.nan
    out[0, 0] = np.inf
    assert tensor_metrics(ref, out)["nonfinite"] == 2


def test_err_ratio():
    ref = np.array([1.0, 2.0, 3.0])
    assert err_ratio(ref, ref + 0.2, ref + 0.1) == pytest.approx(2.0)
    assert err_ratio(ref, ref, ref) == 0.0
    assert err_ratio(ref, ref + 1e-3, ref) > 1e300  # low exact: divided by tiny


SPLIT_CFG = dict(dtype="f16", g=2, seq_len_q=40, seq_len_k=128, num_heads_q=2, num_heads_kv=1,
                 head_dim_qk=16, head_dim_v=8, causal=True, return_lse=True, split_kv=4)


def reference_run():
    c = parse_config(SPLIT_CFG)
    inputs = make_inputs(c)
    ref = attention_splitkv(c, inputs)
    return c, inputs, ref


def test_verify_outputs_keys_and_a_faithful_copy():
    c, inputs, ref = reference_run()
    low = attention_lowprec(c, inputs)
    m = verify_outputs(c, ref, low, ref.out, ref.lse, ref.o_partials.copy(), ref.lse_partials.copy())
    assert tuple(m) == METRIC_KEYS
    assert m["out_rms"] == 0 and m["out_row_err"] == 0 and m["lse_max_abs"] == 0
    assert m["partials_row_err"] == 0 and m["partials_invalid_bad"] == 0 and m["partials_nonfinite"] == 0
    assert m["out_nonfinite"] == 0 and m["lse_inf_mismatch"] == 0 and 0 <= m["out_err_ratio"] <= 1
    # Against the exact float64 reference instead.
    exact = attention_exact(c, inputs)
    m = verify_outputs(c, ref, low, ref.out, ref.lse, exact=exact)
    assert m["out_row_err"] <= 1e-3 and m["lse_max_abs"] < 1e-5


def test_verify_outputs_not_applicable_is_none():
    c, _, ref = reference_run()
    m = verify_outputs(c, ref, None, ref.out, None)
    assert set(m) == set(METRIC_KEYS)
    for key in ("out_err_ratio", "lse_rms", "lse_max_abs", "lse_row_err", "lse_inf_mismatch", "lse_nonfinite",
                "partials_row_err", "partials_lse_max_abs", "partials_invalid_bad", "partials_nonfinite"):
        assert m[key] is None, key
    assert m["out_rms"] == 0


def test_nan_in_one_invalid_partial_is_caught():
    c, _, ref = reference_run()
    o_p, lse_p = ref.o_partials.copy(), ref.lse_partials.copy()
    assert ref.valid_splits[1, 1, 3] == 1  # row 3 sees split 0 only
    o_p[2, 1, 1, 3, 5] = np.nan
    m = verify_outputs(c, ref, None, ref.out, ref.lse, o_p, lse_p)
    assert m["partials_nonfinite"] == 1 and m["partials_invalid_bad"] == 1
    assert m["out_nonfinite"] == 0  # the final output does not show it


def test_wrong_valid_partial_and_nonzero_invalid_partial():
    c, _, ref = reference_run()
    o_p, lse_p = ref.o_partials.copy(), ref.lse_partials.copy()
    o_p[0, 0, 0, 10] *= 1.5            # a valid split, wrong
    lse_p[3, 0, 1, 0] = 0.0            # an invalid split with a finite LSE
    m = verify_outputs(c, ref, None, ref.out, ref.lse, o_p, lse_p)
    assert m["partials_row_err"] == pytest.approx(1 / 3, rel=1e-6)
    assert m["partials_invalid_bad"] == 1 and m["partials_nonfinite"] == 0
    lse_p = ref.lse_partials.copy()
    lse_p[0, 1, 0, 39] += 0.25
    m = verify_outputs(c, ref, None, ref.out, ref.lse, None, lse_p)
    assert m["partials_lse_max_abs"] == pytest.approx(0.25, rel=1e-5) and m["partials_row_err"] == 0


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        tensor_metrics(np.zeros((2, 3)), np.zeros((3, 2)))
