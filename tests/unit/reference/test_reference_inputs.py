"""make_inputs (docs/spec.md §1 "Inputs"), storage types and the layout helpers."""
import math

import ml_dtypes
import numpy as np
import pytest

from attnconfig import ConfigError, parse_config
from reference import make_inputs, output_dtypes, to_logical, to_physical
from reference.layout import logical_view

BASE = dict(dtype="f16", g=2, seq_len_q=3, seq_len_k=5, num_heads_q=4, num_heads_kv=2,
            head_dim_qk=6, head_dim_v=7, data_seed=11)


def cfg(**kw):
    return {**BASE, **kw}


@pytest.mark.parametrize("dtype, storage", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("f32", np.float32)])
def test_float_inputs_shapes_types_and_draw_order(dtype, storage):
    inputs = make_inputs(cfg(dtype=dtype, with_attn_bias=True))
    assert set(inputs) == {"q", "k", "v", "bias"}
    assert inputs["q"].shape == (2, 4, 3, 6)
    assert inputs["k"].shape == (2, 2, 5, 6)
    assert inputs["v"].shape == (2, 2, 5, 7)
    assert inputs["bias"].shape == (2, 4, 3, 5)
    for x in inputs.values():
        assert x.dtype == np.dtype(storage)
    # Order q, k, v, bias from one default_rng(data_seed) stream, normals cast to storage.
    rng = np.random.default_rng(11)
    for key, shape in (("q", (2, 4, 3, 6)), ("k", (2, 2, 5, 6)), ("v", (2, 2, 5, 7)), ("bias", (2, 4, 3, 5))):
        expected = rng.standard_normal(shape).astype(storage)
        np.testing.assert_array_equal(inputs[key].view(np.uint8), expected.view(np.uint8))


def test_i8_inputs_follow_the_spec():
    inputs = make_inputs(cfg(dtype="i8", g=3, seq_len_q=40, seq_len_k=50, head_dim_qk=16, with_attn_bias=True))
    assert set(inputs) == {"q", "k", "v", "bias", "quant_scale", "quant_zero_point"}
    assert inputs["q"].dtype == np.int8 and inputs["k"].dtype == np.int8
    assert inputs["v"].dtype == np.float16 and inputs["bias"].dtype == np.float16
    both = np.concatenate([inputs["q"].ravel(), inputs["k"].ravel()])
    assert both.min() == -8 and both.max() == 7  # the whole range [-8, 7] is drawn
    assert -4 <= inputs["quant_zero_point"] <= 4 and isinstance(inputs["quant_zero_point"], int)
    assert inputs["quant_scale"] == pytest.approx(1 / (8 * math.sqrt(16)))
    rng = np.random.default_rng(11)
    np.testing.assert_array_equal(inputs["q"], rng.integers(-8, 7, size=(3, 4, 40, 16), endpoint=True, dtype=np.int8))
    np.testing.assert_array_equal(inputs["k"], rng.integers(-8, 7, size=(3, 2, 50, 16), endpoint=True, dtype=np.int8))
    np.testing.assert_array_equal(inputs["v"], rng.standard_normal((3, 2, 50, 7)).astype(np.float16))
    np.testing.assert_array_equal(inputs["bias"], rng.standard_normal((3, 4, 40, 50)).astype(np.float16))
    assert inputs["quant_zero_point"] == int(rng.integers(-4, 4, endpoint=True))


def test_same_config_same_bytes_and_seed_changes_them():
    a, b = make_inputs(cfg()), make_inputs(parse_config(cfg()))
    for key in a:
        assert a[key].tobytes() == b[key].tobytes()
    c = make_inputs(cfg(data_seed=12))
    assert a["q"].tobytes() != c["q"].tobytes()


def test_invalid_config_is_rejected_naming_the_field():
    with pytest.raises(ConfigError, match="num_heads_q"):
        make_inputs(cfg(num_heads_q=3))


def test_output_dtypes():
    assert output_dtypes("i8") == (np.float16, np.float16)
    assert output_dtypes("bf16") == (np.dtype(ml_dtypes.bfloat16), np.float32)
    assert output_dtypes(cfg(dtype="f32")) == (np.float32, np.float32)
    assert output_dtypes(cfg(dtype="f16")) == (np.float16, np.float32)


def test_layout_round_trip_and_physical_shape():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    p = to_physical(x, True)
    assert p.shape == (2, 3, 5, 4) and p.flags.c_contiguous
    assert p[1, 2, 3, 0] == x[1, 2, 0, 3]
    np.testing.assert_array_equal(to_logical(p, True), x)
    assert to_physical(x, False) is not None and np.shares_memory(to_physical(x, False), x)
    view = logical_view(p, True)
    view[0, 0, 1, 2] = -1
    assert p[0, 0, 2, 1] == -1


@pytest.mark.parametrize("dtype, storage", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("f32", np.float32)])
def test_chunked_draw_is_the_one_shot_draw(dtype, storage):
    # Tensors of several generator chunks (reference/inputs.py draws 2^16 normals at a time):
    # the stored reproducers need the bytes of one standard_normal(shape).astype(storage).
    c = cfg(dtype=dtype, g=1, seq_len_q=700, seq_len_k=1500, num_heads_q=2, num_heads_kv=1,
            head_dim_qk=100, head_dim_v=33, with_attn_bias=True)
    inputs = make_inputs(c)
    rng = np.random.default_rng(11)
    for key, shape in (("q", (1, 2, 700, 100)), ("k", (1, 1, 1500, 100)), ("v", (1, 1, 1500, 33)),
                       ("bias", (1, 2, 700, 1500))):
        expected = rng.standard_normal(shape).astype(storage)
        assert inputs[key].tobytes() == expected.tobytes(), key


@pytest.mark.parametrize("dtype", ["f16", "i8"])
def test_inputs_are_read_only(dtype):
    # A device thread copies them while the host reference reads them (sweeps/runner.py).
    inputs = make_inputs(cfg(dtype=dtype, with_attn_bias=True))
    for key in ("q", "k", "v", "bias"):
        with pytest.raises(ValueError, match="read-only"):
            inputs[key][(0,) * inputs[key].ndim] = 1
