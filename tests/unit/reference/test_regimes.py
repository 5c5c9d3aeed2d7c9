"""Input regimes (docs/spec.md §1): reproducible bytes, normal unchanged, each regime's property."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from attnconfig import ConfigError, parse_config
from attnconfig.regimes import REGIMES
from reference import attention_exact, make_inputs
from reference.facts import numeric_facts


def digest(inputs) -> str:
    h = hashlib.sha256()
    for key in ("q", "k", "v", "bias"):
        if key in inputs:
            h.update(inputs[key].tobytes())
    h.update(repr((inputs.get("quant_zero_point"), inputs.get("quant_scale"))).encode())
    return h.hexdigest()[:32]


# make_inputs digests and content hashes of these configs, taken before data_regime existed.
PINNED = [
    (dict(dtype="f16", g=2, seq_len_q=5, seq_len_k=77, num_heads_q=4, num_heads_kv=2, head_dim_qk=24, head_dim_v=40,
          with_attn_bias=True, data_seed=11), "ad146165fa553e6d48562a34f4569102", "12a30b46cec1ad1f9fef56108f75db84"),
    (dict(dtype="bf16", g=1, seq_len_q=3, seq_len_k=130, num_heads_q=2, num_heads_kv=2, head_dim_qk=64, head_dim_v=16,
          causal=True, data_seed=12), "a8b3f729ba57fb69f82bb744ce3f0a63", "220f8d39bb86cf6040e701a8654f53d8"),
    (dict(dtype="f32", g=3, seq_len_q=1, seq_len_k=50, num_heads_q=8, num_heads_kv=1, head_dim_qk=7, head_dim_v=9,
          current_seq_len=[0, 20, 49], return_lse=True, split_kv=4, data_seed=13),
     "1b12560aa1c223fd5db538a9329d8ac6", "2331c68c9b81af174740ecf2f0a9e21a"),
    (dict(dtype="i8", g=1, seq_len_q=4, seq_len_k=90, num_heads_q=4, num_heads_kv=4, head_dim_qk=32, head_dim_v=32,
          with_attn_bias=True, with_attn_scale=False, data_seed=14),
     "10b168338fff35bdba7e396126637762", "734cbab80b39d2df69df8a5f328f8058"),
]


@pytest.mark.parametrize("fields, inputs_digest, config_hash", PINNED, ids=[f["dtype"] for f, _, _ in PINNED])
def test_normal_keeps_its_bytes_hash_and_json(fields, inputs_digest, config_hash):
    for c in (parse_config(fields), parse_config({**fields, "data_regime": "normal"})):
        assert digest(make_inputs(c)) == inputs_digest
        assert c.content_hash() == config_hash
        assert "data_regime" not in c.to_json() and "data_regime" not in c.to_dict()


BASE = dict(g=2, seq_len_q=8, seq_len_k=300, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=32,
            with_attn_bias=True, return_lse=True, data_seed=7)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_regimes_are_reproducible_and_distinct(dtype):
    seen = {}
    for regime in REGIMES:
        c = parse_config({**BASE, "dtype": dtype, "data_regime": regime})
        d = digest(make_inputs(c))
        assert d == digest(make_inputs(parse_config(c.to_json()))), regime  # a reproducer's JSON
        seen[regime] = d
        if regime != "normal":
            assert c.to_dict()["data_regime"] == regime
            assert c.content_hash() != parse_config({**BASE, "dtype": dtype}).content_hash()
    assert len(set(seen.values())) == len(REGIMES)


def test_unknown_regime_names_field_and_rule():
    with pytest.raises(ConfigError, match="data_regime"):
        parse_config({**BASE, "dtype": "f16", "data_regime": "spiky"})


def _facts(c):
    inputs = make_inputs(c)
    out, lse = attention_exact(c, inputs)[:2]
    return inputs, lse, numeric_facts(c, inputs, lse)


def _weights(c, inputs):
    """Softmax weights of every row of batch 0, head 0 (no masks in these configs)."""
    q = inputs["q"][0, 0].astype(np.float64)
    k = inputs["k"][0, 0].astype(np.float64)
    s = q @ k.T
    if c.dtype == "i8":
        s = (s - inputs["quant_zero_point"]) * inputs["quant_scale"]
    s = s / np.sqrt(c.head_dim_qk) if c.with_attn_scale else s
    if "bias" in inputs:
        s = s + inputs["bias"][0, 0].astype(np.float64)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
@pytest.mark.parametrize("scale", [True, False])
def test_sink_takes_most_of_every_row(dtype, scale):
    c = parse_config({**BASE, "dtype": dtype, "with_attn_scale": scale, "data_regime": "sink"})
    inputs = make_inputs(c)
    top = _weights(c, inputs).max(axis=1)
    assert (top > 0.9).mean() >= 0.9


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_outlier_channels_stand_out(dtype):
    c = parse_config({**BASE, "dtype": dtype, "data_regime": "outliers"})
    inputs = make_inputs(c)
    for name in ("q", "k"):
        norms = np.sqrt((inputs[name].astype(np.float64) ** 2).reshape(-1, c.head_dim_qk).sum(axis=0))
        ratio = norms.max() / np.median(norms)
        assert ratio >= 8, (name, ratio)  # factors of 10-100 (i8: 16) on at least one channel


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
@pytest.mark.parametrize("scale", [True, False])
def test_large_logits_reach_hundreds(dtype, scale):
    c = parse_config({**BASE, "dtype": dtype, "with_attn_scale": scale, "data_regime": "large_logits"})
    _, lse, facts = _facts(c)
    assert np.abs(lse).min() >= 100
    assert facts["fact_max_abs_lse"] >= 100
    inputs = make_inputs(c)
    for name in ("q", "k"):
        assert np.isfinite(inputs[name].astype(np.float64)).all()


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_uniform_is_near_uniform(dtype):
    c = parse_config({**BASE, "dtype": dtype, "data_regime": "uniform"})
    inputs = make_inputs(c)
    top = _weights(c, inputs).max(axis=1)
    assert (top * c.seq_len_k).max() <= 1.2
    assert _facts(c)[2]["fact_flatness"] <= 1.2


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_cancellation_v_has_large_values_of_both_signs(dtype):
    c = parse_config({**BASE, "dtype": dtype, "data_regime": "cancellation"})
    v = make_inputs(c)["v"].astype(np.float64)
    row_means = v[0, 0].mean(axis=1)
    assert (row_means > 200).any() and (row_means < -200).any()
    assert abs(v[0, 0].mean()) < 0.2 * np.abs(v[0, 0]).mean()


def test_facts_of_normal_inputs():
    c = parse_config({**BASE, "dtype": "f32"})
    inputs, lse, facts = _facts(c)
    assert facts["fact_masked_rows"] == 0
    assert facts["fact_max_abs_lse"] == pytest.approx(np.abs(lse).max())
    assert 0 < facts["fact_top_weight"] < 1 and facts["fact_flatness"] >= 1
