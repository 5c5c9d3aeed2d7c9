"""Input regimes (docs/spec.md §1): reproducible bytes, normal unchanged, each regime's property."""
from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest

from attnconfig import ConfigError, parse_config
from attnconfig.regimes import REGIMES
from reference import attention_exact, make_inputs
import reference.regimes as regimes
from reference.chunks import Workspace
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

# make_inputs digests of every regime and dtype, taken before the regimes' channel transforms
# skipped the channels they leave as they are (and before the compiled normal draws).
REGIME_BASE = dict(g=2, seq_len_q=9, seq_len_k=300, num_heads_q=4, num_heads_kv=2, head_dim_qk=40, head_dim_v=24,
                   with_attn_bias=True, causal=True, data_seed=4242)
REGIME_PINNED = {
    "sink-f16": "22dbc61388c0a368fe7ca164d162dc4c",
    "sink-bf16": "6d40199024be40a2aa64a31477c17b73",
    "sink-f32": "8901a940bb10ba39dfb4d68aa4353f68",
    "sink-i8": "2e4ee8e65ce77aa9290784eedac105c4",
    "outliers-f16": "4bd82a878553127046a5f40c92552943",
    "outliers-bf16": "56ab22f028fbf3f347496270a55954e2",
    "outliers-f32": "9ff7bdc7db8ea9d9308bebb235255b9a",
    "outliers-i8": "b62194ef28a3b54f5af62c09217267ad",
    "large_logits-f16": "f53422a780c12ca8e4c60930481cb933",
    "large_logits-bf16": "0d2860abe067e88eb155412048efd0a5",
    "large_logits-f32": "7b6185c393f66164e3c341a9093d432e",
    "large_logits-i8": "ee971ccd49df5ac7c48c20be5991d4fd",
    "uniform-f16": "fad28a36e18be25a57550561d12c4d26",
    "uniform-bf16": "c198a61e4e81e15d5b0ffaa0b9f348aa",
    "uniform-f32": "1b8e4b7cafcd99683eeb914d86cc3813",
    "uniform-i8": "79f0ac2b30c302a4b198e42b15ccd4fa",
    "cancellation-f16": "8298b1fb531799a39e33b0e1180a9577",
    "cancellation-bf16": "70c35c4a32460645e971d1a8d3e8e582",
    "cancellation-f32": "8827b1d8dc37ebe5ad96413a2c02cd27",
    "cancellation-i8": "6e85bfb5926795fb516cd9d1bf9ad514",
}


@pytest.mark.parametrize("name", sorted(REGIME_PINNED))
def test_regimes_keep_their_bytes(name):
    regime, dtype = name.rsplit("-", 1)
    assert digest(make_inputs(parse_config({**REGIME_BASE, "dtype": dtype, "data_regime": regime}))) == REGIME_PINNED[name]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.int8], ids=lambda d: np.dtype(d).name)
def test_channel_transform_of_some_channels_is_the_formula(dtype):
    # Every channel through x * scale + offset in float64, rounded once: the untouched ones too,
    # where a -0 becomes +0.
    rng = np.random.default_rng(3)
    x64 = rng.integers(-8, 8, size=(3, 5, 70, 16)).astype(np.float64) if dtype == np.int8 else rng.standard_normal((3, 5, 70, 16))
    if dtype != np.int8:
        x64[0, 0, :, :] = -0.0
    x = x64.astype(dtype)
    scale, offset = np.ones(16), np.zeros(16)
    scale[[2, 9]], offset[9] = [16.0, 0.0], 3.0
    values = x.astype(np.float64) * scale
    if dtype == np.int8:
        values = np.fix(values)
    values = values + offset
    want = np.clip(values, -128, 127).astype(np.int8) if dtype == np.int8 else values.astype(dtype)
    got = x.copy()
    regimes._channels(got, scale, offset, Workspace())
    assert got.tobytes() == want.tobytes()
    if dtype != np.int8:
        assert not np.signbit(got[0, 0]).any()


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
