"""Input data regimes (docs/spec.md §1 "Input regimes"): what a config's inputs look like.

`make_inputs` draws the `normal` tensors first, exactly as a config without a regime gets them,
then `apply_regime` reshapes them in place. Every choice a regime makes (which key is the sink,
which channels are outliers, how large the logits are) comes from its own generator seeded by
the config's data_seed and the regime, so one config gives one set of bytes everywhere, and the
choices are known without drawing a tensor (`regime_plan`): the tolerance policy reads a
regime's logit magnitude from the plan before anything runs.

Float tensors are transformed in float64 and rounded once more to the storage type; i8 Q and K
stay integers in [-128, 127]. Values stay far inside every dtype's range (the largest is a
sink or large-logit mean of about 32, an outlier of about 600, a cancelling V of 262).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnconfig import AttentionConfig
from attnconfig.regimes import REGIMES
from reference.chunks import Workspace
from reference.masks import last_valid_keys, prefix_offsets
from reference.normals import narrow

_CHUNK = 1 << 16
# Standard deviation of an i8 draw (uniform integers in [-8, 7]: variance 21.25 + mean 0.25).
I8_STD = math.sqrt(21.5)
# The sink's logit lead over the other keys' typical logits (on top of six standard deviations
# of their spread): e^-16 leaves every other key a weight of 1e-7, so the sink holds > 90%
# of a row even against 16384 keys.
SINK_LEAD = 16.0
LARGE_LOGITS = (200.0, 1000.0)  # |mean logit| of large_logits, log-uniform in this range
UNIFORM_LOGIT_STD = 0.01        # logit spread of uniform: weights within 1% of 1/n
OUTLIER_FACTORS = (10.0, 100.0)  # float outlier channels: factor log-uniform in this range
I8_OUTLIER_FACTOR = 16           # i8 outlier channels: the base range [-8, 7] times 16 fills int8
CANCEL_MAGNITUDE = 256.0         # cancellation: each V row gets +-256 on every channel
I8_MAX_MEAN = 119                # an i8 mean plus a draw in [-8, 7] stays <= 127


@dataclass(frozen=True)
class RegimePlan:
    """A regime's choices for one config; the transforms of `apply_regime` in numbers.

    Q and K channel d become `x * scale[d] + offset[d]` (i8: `fix(x * scale[d]) + offset[d]`,
    clipped to int8); then K row `sink_keys[b]` gets `sink_value` on `sink_channels` in every kv
    head of batch entry b. V row j gets `v_offset[j]` on every channel; the bias is multiplied
    by `bias_scale`. `logit_scale` estimates the largest |logit| the inputs give (six standard
    deviations of the logit spread plus its mean, after the softmax scale and, for i8, the
    quantisation scale): what the tolerance policy scales its bounds by."""

    regime: str
    q_scale: np.ndarray
    q_offset: np.ndarray
    k_scale: np.ndarray
    k_offset: np.ndarray
    bias_scale: float = 1.0
    v_offset: np.ndarray | None = None
    sink_keys: np.ndarray | None = None
    sink_channels: np.ndarray | None = None
    sink_value: float = 0.0
    logit_scale: float = 0.0


def regime_rng(c: AttentionConfig) -> np.random.Generator:
    """The regime's own stream: the data_seed's normal stream is left as `normal` draws it."""
    return np.random.default_rng([c.data_seed, 0x7E61, REGIMES.index(c.data_regime)])


def _scales(c: AttentionConfig) -> tuple[float, float]:
    """(value std of a Q or K draw, factor from a Q.K sum to a logit) of the config's dtype."""
    s = 1.0 / math.sqrt(c.head_dim_qk) if c.with_attn_scale else 1.0
    if c.dtype == "i8":
        return I8_STD, s / (8.0 * math.sqrt(c.head_dim_qk))  # the quantisation scale of §1
    return 1.0, s


def _logit_scale(c: AttentionConfig, plan: dict[str, Any]) -> float:
    std, to_logit = _scales(c)
    sq, mq, sk, mk = (np.asarray(plan[k], dtype=np.float64) for k in ("q_scale", "q_offset", "k_scale", "k_offset"))
    sq, sk = sq * std, sk * std
    var = float(np.sum(sq * sq * sk * sk + sq * sq * mk * mk + mq * mq * sk * sk))
    mean = abs(float(np.sum(mq * mk)))
    scale = to_logit * (6.0 * math.sqrt(var) + mean)
    if plan.get("sink_channels") is not None:
        scale += to_logit * len(plan["sink_channels"]) * plan["sink_value"] ** 2
    if c.with_attn_bias:
        scale += 6.0 * plan.get("bias_scale", 1.0)
    return scale


def regime_plan(c: AttentionConfig) -> RegimePlan:
    """The regime's choices for config c; cheap (no tensor is drawn)."""
    d = c.head_dim_qk
    ones, zeros = np.ones(d), np.zeros(d)
    plan: dict[str, Any] = dict(q_scale=ones, q_offset=zeros, k_scale=ones, k_offset=zeros)
    rng = regime_rng(c) if c.data_regime != "normal" else None
    std, to_logit = _scales(c)
    i8 = c.dtype == "i8"
    bias_spread = 6.0 if c.with_attn_bias else 0.0
    if c.data_regime == "sink":
        # The sink leads by SINK_LEAD plus six standard deviations of the other logits (and of
        # the bias). Float: one channel, Q's and the sink key's value sqrt(need / scale); i8:
        # enough channels at <= 127 to reach it. Every other key is 0 on those channels.
        need = SINK_LEAD + 6.0 * to_logit * std * std * math.sqrt(d) + bias_spread
        if i8:
            n = min(d, math.ceil(need / (127 * 127 * to_logit)))
            value = float(min(127, math.ceil(math.sqrt(need / (n * to_logit)))))
        else:
            n, value = 1, math.sqrt(need / to_logit)
        channels = np.sort(rng.choice(d, size=n, replace=False))
        keys = np.array([rng.integers(0, L + 1) for L in last_valid_keys(c)], dtype=np.int64)
        if c.causal:
            keys = np.minimum(keys, prefix_offsets(c))  # visible to row 0, hence to every row
        q_scale, q_offset, k_scale = ones.copy(), zeros.copy(), ones.copy()
        q_scale[channels], q_offset[channels], k_scale[channels] = 0.0, value, 0.0
        plan.update(q_scale=q_scale, q_offset=q_offset, k_scale=k_scale, sink_keys=keys,
                    sink_channels=channels, sink_value=value)
    elif c.data_regime == "outliers":
        n = min(int(rng.integers(1, 5)), max(1, d // 8))
        channels = np.sort(rng.choice(d, size=n, replace=False))
        scale = ones.copy()
        if i8:
            scale[channels] = I8_OUTLIER_FACTOR
        else:
            scale[channels] = np.exp(rng.uniform(math.log(OUTLIER_FACTORS[0]), math.log(OUTLIER_FACTORS[1]), size=n))
        plan.update(q_scale=scale, k_scale=scale.copy())
    elif c.data_regime == "large_logits":
        # Q's mean mu and K's mean +-mu on every channel give every logit the mean +-d * mu^2
        # (times the scales): +-T with T log-uniform in LARGE_LOGITS.
        target = math.exp(rng.uniform(math.log(LARGE_LOGITS[0]), math.log(LARGE_LOGITS[1])))
        sign = 1.0 if rng.random() < 0.5 else -1.0
        mu = math.sqrt(target / (d * to_logit))
        if i8:
            mu = float(min(I8_MAX_MEAN, max(1, round(mu))))
        plan.update(q_offset=np.full(d, mu), k_offset=np.full(d, sign * mu))
    elif c.data_regime == "uniform":
        if i8:
            # fix(x / 8) keeps -8 as -1 and sends the rest to 0: sparse, tiny dot products.
            plan.update(q_scale=np.full(d, 0.125), k_scale=np.full(d, 0.125))
        else:
            plan.update(q_scale=np.full(d, UNIFORM_LOGIT_STD / (to_logit * math.sqrt(d))))
        plan["bias_scale"] = UNIFORM_LOGIT_STD
    elif c.data_regime == "cancellation":
        signs = rng.integers(0, 2, size=c.seq_len_k) * 2 - 1
        plan["v_offset"] = CANCEL_MAGNITUDE * signs.astype(np.float64)
    plan["logit_scale"] = _logit_scale(c, plan)
    return RegimePlan(regime=c.data_regime, **plan)


def _rows(x: np.ndarray):
    """Row blocks of x viewed as [rows, last axis], about _CHUNK elements each."""
    flat = x.reshape(-1, x.shape[-1])
    step = max(1, _CHUNK // max(1, x.shape[-1]))
    for r in range(0, flat.shape[0], step):
        yield r, flat[r:r + step]


def _store(block: np.ndarray, values: np.ndarray, work: Workspace) -> None:
    """block[...] = values (float64), rounded once to block's type (int8: clipped)."""
    if block.dtype == np.int8:
        block[...] = np.clip(values, -128, 127).astype(np.int8)
    else:
        narrow(values.reshape(-1), block.reshape(-1), work)


def _rounded(values: np.ndarray, dtype: np.dtype, work: Workspace) -> np.ndarray:
    out = np.empty(values.shape, dtype=dtype)
    _store(out, np.ascontiguousarray(values), work)
    return out


def _channels(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, work: Workspace) -> None:
    """x[..., d] = x[..., d] * scale[d] + offset[d] (i8: fix of the product), rounded once."""
    changed = (scale != 1.0) | (offset != 0.0)
    if not changed.any():
        return
    if not changed.all():
        # Outliers and sinks change a few channels: only those go through float64. x * 1 + 0
        # is x on every other channel, but for the sign of a zero: -0 + 0 is +0 (float draws
        # round to -0 now and then; int8 has no -0). The changed channels are written after.
        if x.dtype != np.int8:
            _positive_zeros(x)
        picked = np.flatnonzero(changed)
        x[..., picked] = _rounded(_channel_values(x[..., picked], scale[picked], offset[picked]), x.dtype, work)
        return
    for _, block in _rows(x):
        _store(block, _channel_values(block, scale, offset), work)


def _channel_values(x: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    values = x.astype(np.float64) * scale
    if x.dtype == np.int8:
        values = np.fix(values)
    return values + offset


def _positive_zeros(x: np.ndarray) -> None:
    """-0 -> +0 in a float tensor, in place, a row block at a time."""
    bits = x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
    sign = bits.dtype.type(1 << (8 * x.dtype.itemsize - 1))
    for _, block in _rows(bits):
        negative_zero = block == sign
        if negative_zero.any():
            block[negative_zero] = 0


def apply_regime(c: AttentionConfig, inputs: dict[str, Any], work: Workspace) -> None:
    """Reshape make_inputs' normal tensors (writable, logical layout) into c's regime, in place."""
    if c.data_regime == "normal":
        return
    plan = regime_plan(c)
    _channels(inputs["q"], plan.q_scale, plan.q_offset, work)
    _channels(inputs["k"], plan.k_scale, plan.k_offset, work)
    if plan.sink_keys is not None:
        k = inputs["k"]
        value = np.empty(len(plan.sink_channels), dtype=k.dtype)
        _store(value, np.full(len(plan.sink_channels), plan.sink_value), work)
        for b, j in enumerate(plan.sink_keys):
            k[b][:, j, plan.sink_channels] = value  # [heads, channels]
        # The sink's V row is scaled up to a largest |value| of at least 1: a row's output is
        # about that V row, and tiny values would put it among f16's subnormals, where one ulp
        # of rounding is a large part of the output and the row gate cannot tell it from a bug.
        v = inputs["v"]
        for b, j in enumerate(plan.sink_keys):
            rows = v[b, :, j, :].astype(np.float64)  # [heads, head_dim_v]
            peak = np.abs(rows).max(axis=1, keepdims=True)
            scaled = np.where(peak == 0, 1.0, rows / np.where(peak == 0, 1.0, peak))
            v[b, :, j, :] = _rounded(np.where(peak < 1.0, scaled, rows), v.dtype, work)
    if plan.v_offset is not None:
        v = inputs["v"]
        for b in range(v.shape[0]):
            for h in range(v.shape[1]):
                for r, block in _rows(v[b, h]):
                    _store(block, block.astype(np.float64) + plan.v_offset[r:r + len(block), None], work)
    if plan.bias_scale != 1.0 and "bias" in inputs:
        for _, block in _rows(inputs["bias"]):
            _store(block, block.astype(np.float64) * plan.bias_scale, work)
