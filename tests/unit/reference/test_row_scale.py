"""The row gate's scale: cancelling rows of a correct kernel pass, a wrong row still fails."""
from __future__ import annotations

import numpy as np

from attnconfig import parse_config
from reference import RowScales, attention_splitkv, magnitude_reference, make_inputs, verify_outputs

CFG = dict(dtype="f16", g=4, seq_len_q=64, seq_len_k=300, num_heads_q=4, num_heads_kv=2, head_dim_qk=32,
           head_dim_v=1, return_lse=True, split_kv=4, data_seed=3)


def _metrics(c, out, magnitude=True):
    inputs = make_inputs(c)
    ref = attention_splitkv(c, inputs)
    mag = RowScales.of(magnitude_reference(c, inputs)) if magnitude else None
    return ref, verify_outputs(c, ref, None, out, ref.lse, magnitude=mag)


def test_cancelling_single_element_rows_of_a_correct_rounding_pass():
    c = parse_config(CFG)
    ref = attention_splitkv(c, make_inputs(c))
    # One f16 ulp of the row's scale, as a kernel rounding P and accumulating in f32 makes.
    mag = magnitude_reference(c, make_inputs(c)).out_f32
    noisy = (ref.out_f32 + np.float32(2.0 ** -11) * mag).astype(np.float16)
    _, with_scale = _metrics(c, noisy)
    _, without = _metrics(c, noisy, magnitude=False)
    assert with_scale["out_row_err"] < 2e-3
    assert without["out_row_err"] > with_scale["out_row_err"] * 5  # the cancellation the scale fixes


def test_one_wrong_row_still_fails_with_the_scale():
    c = parse_config({**CFG, "head_dim_v": 64})
    ref = attention_splitkv(c, make_inputs(c))
    bad = ref.out.copy()
    bad[1, 2, 7] = -bad[1, 2, 7]
    _, m = _metrics(c, bad)
    assert m["out_row_err"] > 0.1
    assert m["out_rms"] < 0.1
