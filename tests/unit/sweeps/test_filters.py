"""Prefilters of docs/spec.md §6: budget, formulas, boundaries and order."""
from __future__ import annotations

import pytest

from attnconfig.config import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes
from sweeps.filters import (
    ALL_REASONS,
    FILTER_REASONS,
    Prefilter,
    reference_bytes,
    reference_flops,
    splitkv_budget,
)
from sweeps.spec import SweepSpec

GIB = 1 << 30
BIG = 10**30


def cfg(**kw) -> AttentionConfig:
    base = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=1, num_heads_q=1, num_heads_kv=1,
                head_dim_qk=1, head_dim_v=1)
    base.update(kw)
    return AttentionConfig(**base)


def pf(max_tokens=BIG, budget=BIG, flops=1e300, nbytes=BIG) -> Prefilter:
    return Prefilter(max_tokens=max_tokens, splitkv_budget=budget, reference_flops_limit=flops,
                     reference_bytes_limit=nbytes)


def test_reason_names_and_order():
    assert FILTER_REASONS == ("max_tokens", "splitkv_extra_bytes", "reference_flops", "reference_bytes")
    assert ALL_REASONS == FILTER_REASONS + ("duplicate",)


@pytest.mark.parametrize("total, expected", [
    (None, 3 * GIB // 2),          # no device: 1.5 GiB
    (4 * GIB, GIB),                # 0.5 GiB clamped up to 1 GiB
    (8 * GIB, GIB),                # exactly the lower clamp
    (16 * GIB, 2 * GIB),           # inside the clamp: total // 8
    (24 * GIB + 7, 3 * GIB),       # floor division
    (64 * GIB, 8 * GIB),           # exactly the upper clamp
    (141 * GIB, 8 * GIB),          # H200: clamped down to 8 GiB
])
def test_splitkv_budget_clamp(total, expected):
    assert splitkv_budget(total, None) == expected


@pytest.mark.parametrize("total", [None, 4 * GIB, 141 * GIB])
def test_splitkv_budget_override_wins(total):
    assert splitkv_budget(total, 123) == 123
    assert splitkv_budget(total, 0) == 0
    assert splitkv_budget(total, 100 * GIB) == 100 * GIB


def test_splitkv_budget_negative_override_rejected():
    with pytest.raises(ValueError, match="splitkv_extra_bytes_limit"):
        splitkv_budget(None, -1)


def test_reference_flops_formula():
    c = cfg(g=3, num_heads_q=4, num_heads_kv=2, seq_len_q=5, seq_len_k=7, head_dim_qk=11, head_dim_v=13)
    assert reference_flops(c) == 3 * 4 * 5 * 7 * (2 * (11 + 13) + 8)


def test_reference_bytes_formula_with_and_without_bias():
    kw = dict(g=3, num_heads_q=4, num_heads_kv=2, seq_len_q=5, seq_len_k=7, head_dim_qk=11, head_dim_v=13)
    out = 3 * 4 * 5 * 13
    q = 3 * 4 * 5 * 11
    k = 3 * 2 * 7 * 11
    v = 3 * 2 * 7 * 13
    bias = 3 * 4 * 5 * 7
    assert reference_bytes(cfg(**kw)) == 8 * (out + q + k + v)
    assert reference_bytes(cfg(with_attn_bias=True, **kw)) == 8 * (out + q + k + v + bias)


def test_max_tokens_boundary():
    at = cfg(g=2, seq_len_q=10, seq_len_k=50)   # max(10, 50) * 2 = 100
    over = cfg(g=2, seq_len_q=10, seq_len_k=51)  # 102
    assert pf(max_tokens=100).reason(at) is None
    assert pf(max_tokens=100).reason(over) == "max_tokens"
    # seq_len_q counts too when it is the larger one
    assert pf(max_tokens=100).reason(cfg(g=2, seq_len_q=51, seq_len_k=1)) == "max_tokens"


def test_splitkv_boundary_and_no_partials_for_split_one():
    c = cfg(return_lse=True, split_kv=2, head_dim_v=3, g=2, num_heads_q=2, seq_len_q=3)
    need = 2 * 2 * 2 * 3 * (3 + 1) * 4
    assert splitkv_extra_bytes(c) == need
    assert pf(budget=need).reason(c) is None
    assert pf(budget=need - 1).reason(c) == "splitkv_extra_bytes"
    # split_kv = 1 allocates no partials: passes even a zero budget
    assert pf(budget=0).reason(cfg(return_lse=True, split_kv=1, head_dim_v=1024)) is None


def test_reference_flops_boundary():
    c = cfg(g=2, num_heads_q=2, seq_len_q=3, seq_len_k=5, head_dim_qk=7, head_dim_v=9)
    f = reference_flops(c)
    assert pf(flops=float(f)).reason(c) is None
    assert pf(flops=float(f - 1)).reason(c) == "reference_flops"


def test_reference_bytes_boundary():
    c = cfg(g=2, num_heads_q=2, seq_len_q=3, seq_len_k=5, head_dim_qk=7, head_dim_v=9, with_attn_bias=True)
    b = reference_bytes(c)
    assert pf(nbytes=b).reason(c) is None
    assert pf(nbytes=b - 1).reason(c) == "reference_bytes"


def test_first_rejecting_filter_is_the_reason():
    c = cfg(g=4, num_heads_q=8, num_heads_kv=8, seq_len_q=64, seq_len_k=64, head_dim_qk=64,
            head_dim_v=64, return_lse=True, split_kv=8)
    assert pf(max_tokens=1, budget=1, flops=1.0, nbytes=1).reason(c) == "max_tokens"
    assert pf(budget=1, flops=1.0, nbytes=1).reason(c) == "splitkv_extra_bytes"
    assert pf(flops=1.0, nbytes=1).reason(c) == "reference_flops"
    assert pf(nbytes=1).reason(c) == "reference_bytes"
    assert pf().reason(c) is None


def test_from_spec_takes_the_spec_limits_and_explain_names_value_and_limit():
    spec = SweepSpec(max_tokens=100, reference_flops_limit=5e3, reference_bytes_limit=777)
    p = Prefilter.from_spec(spec, 4096)
    assert (p.max_tokens, p.splitkv_budget, p.reference_flops_limit, p.reference_bytes_limit) == (100, 4096, 5e3, 777)
    c = cfg(g=2, seq_len_q=10, seq_len_k=51)
    assert p.explain(c) == "max_tokens: 102 > 100"
    assert p.explain(cfg()) is None
