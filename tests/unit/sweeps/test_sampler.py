"""SweepSpec validation and the sampler of docs/spec.md §6."""
from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pytest

from attnconfig.config import AttentionConfig
from sweeps.filters import ALL_REASONS, Prefilter
from sweeps.sampler import (
    COMMON_HEAD_DIMS,
    ConfigDrawer,
    SamplingExhausted,
    collect_configs,
    sample,
)
from sweeps.spec import SweepSpec, SweepSpecError, parse_range, parse_ranges, parse_sweep_spec

GIB = 1 << 30
BUDGET = 3 * GIB // 2


def problems_of(obj) -> str:
    with pytest.raises(SweepSpecError) as ei:
        parse_sweep_spec(obj)
    return str(ei.value)


# --- SweepSpec ---------------------------------------------------------------------------------

def test_spec_defaults():
    s = SweepSpec()
    assert s.samples == 50 and s.dtypes == ["f16", "bf16", "f32", "i8"] and s.backend == "auto"
    assert s.max_tokens == 16384 and s.reference_flops_limit == 2e10 and s.reference_bytes_limit == GIB
    assert s.splitkv_extra_bytes_limit is None and s.err_ratio_gate is None and s.ranges == {}
    assert s.resolved_max_draws() == 50_000
    assert SweepSpec(samples=3, max_draws=7).resolved_max_draws() == 7


def test_resolved_seed_is_iso_week_when_none():
    assert SweepSpec(seed=None).resolved_seed(dt.date(2024, 1, 1)) == 1
    assert SweepSpec(seed=None).resolved_seed(dt.date(2020, 12, 31)) == 53
    assert SweepSpec(seed=None).resolved_seed() == dt.date.today().isocalendar().week
    assert SweepSpec(seed=0).resolved_seed(dt.date(2024, 1, 1)) == 0


@pytest.mark.parametrize("obj, field, rule", [
    ({"samples": 0}, "samples", "greater than or equal to 1"),
    ({"samples": "5"}, "samples", "valid integer"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"dtypes": []}, "dtypes", "at least 1"),
    ({"dtypes": ["f16", "f64"]}, "dtypes.1", "'f64': Input should be 'f16'"),
    ({"dtypes": ["f16", "bf16", "f16"]}, "dtypes", "must not repeat"),
    ({"backend": "rocm"}, "backend", "'auto'"),
    ({"colour": "red"}, "colour", "Extra inputs are not permitted"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"reference_flops_limit": 0}, "reference_flops_limit", "greater than 0"),
    ({"err_ratio_gate": -1.0}, "err_ratio_gate", "greater than 0"),
    ({"ranges": {"gg": [1, 2]}}, "ranges.gg", "allowed: g, seq_len_q, seq_len_k"),
    ({"ranges": {"g": [5, 3]}}, "ranges.g", "lo must be <= hi"),
    ({"ranges": {"g": [0, 3]}}, "ranges.g", "lo must be >= 1"),
    ({"ranges": {"g": [1, 2, 3]}}, "ranges.g", "at most 2 items"),
    ({"ranges": {"head_dim_v": [1, 2048]}}, "ranges.head_dim_v", "hi must be <= 1024"),
    ({"ranges": {"trans_k": [0, 2]}}, "ranges.trans_k", "hi must be <= 1"),
    ({"ranges": {"causal": [-1, 0]}}, "ranges.causal", "lo must be >= 0"),
    ({"ranges": {"split_kv": [3, 3]}}, "ranges.split_kv", "no power of two"),
    ({"ranges": {"num_heads_q": [3, 3]}}, "ranges.num_heads_q", "allows no heads draw"),
    ({"ranges": {"num_heads_q": [2, 4], "num_heads_kv": [8, 8]}}, "ranges.num_heads_q", "allows no heads draw"),
    ({"samples": 10, "max_draws": 5}, "max_draws", "must be >= samples=10"),
])
def test_spec_errors_name_field_and_rule(obj, field, rule):
    msg = problems_of(obj)
    assert f"{field}:" in msg and rule in msg, msg


def test_spec_reports_every_broken_field_at_once():
    msg = problems_of({"samples": 0, "ranges": {"g": [5, 3]}, "backend": "x"})
    assert "samples:" in msg and "ranges.g:" in msg and "backend:" in msg


def test_spec_accepts_json_ranges_as_lists():
    s = parse_sweep_spec({"ranges": {"g": [1, 64]}, "dtypes": ["bf16"]})
    assert s.ranges == {"g": (1, 64)} and s.range_of("g") == (1, 64)
    assert s.range_of("seq_len_k") == (1, 16384)


def test_parse_range():
    assert parse_range("g=1:64") == ("g", (1, 64))
    assert parse_range(" seq_len_k = 100 : 200 ") == ("seq_len_k", (100, 200))
    assert parse_range("split_kv=8") == ("split_kv", (8, 8))
    with pytest.raises(SweepSpecError, match=r"expected NAME=LO:HI.*g=1:64"):
        parse_range("g1:64")
    with pytest.raises(SweepSpecError, match=r"ranges.foo: unknown range 'foo'; allowed: g, seq_len_q"):
        parse_range("foo=1:2")
    with pytest.raises(SweepSpecError, match="lo must be <= hi"):
        parse_range("g=5:3")
    assert parse_ranges(["g=1:4", "split_kv=2:8"]) == {"g": (1, 4), "split_kv": (2, 8)}
    with pytest.raises(SweepSpecError, match="given twice"):
        parse_ranges(["g=1:4", "g=2:2"])


# --- determinism and bookkeeping ---------------------------------------------------------------

def _json(res):
    return [c.to_json() for c in res.configs]


def test_same_seed_same_configs_different_seed_different():
    a = sample(SweepSpec(samples=200, seed=11), BUDGET)
    b = sample(SweepSpec(samples=200, seed=11), BUDGET)
    c = sample(SweepSpec(samples=200, seed=12), BUDGET)
    assert _json(a) == _json(b) and a.filtered == b.filtered and a.draws == b.draws and a.seed == 11
    assert len(set(_json(a)) & set(_json(c))) == 0


def test_fewer_samples_is_a_prefix_and_unaffected_by_other_fields():
    big = sample(SweepSpec(samples=150, seed=5), BUDGET)
    small = sample(SweepSpec(samples=40, seed=5, label="x", backend="cpu", err_ratio_gate=3.0), BUDGET)
    assert _json(small) == _json(big)[:40]


def test_dtype_order_in_request_does_not_matter():
    a = sample(SweepSpec(samples=50, seed=2, dtypes=["f16", "i8"]), BUDGET)
    b = sample(SweepSpec(samples=50, seed=2, dtypes=["i8", "f16"]), BUDGET)
    assert _json(a) == _json(b)
    assert {c.dtype for c in a.configs} == {"f16", "i8"}


def test_counts_cover_every_draw_and_accepted_pass_every_filter():
    spec = SweepSpec(samples=500, seed=3, reference_flops_limit=1e8, reference_bytes_limit=1 << 24,
                     max_tokens=4096)
    budget = 1 << 22
    res = sample(spec, budget)
    assert len(res.configs) == 500
    assert set(res.filtered) == set(ALL_REASONS)
    assert sum(res.filtered.values()) == res.draws - len(res.configs)
    # these tight limits reject for each filter reason
    for r in ("splitkv_extra_bytes", "reference_flops", "reference_bytes"):
        assert res.filtered[r] > 0, res.filtered
    p = Prefilter.from_spec(spec, budget)
    assert all(p.reason(c) is None for c in res.configs)
    hashes = [c.content_hash() for c in res.configs]
    assert len(set(hashes)) == len(hashes) and hashes == res.accepted_hashes


def test_seed_none_uses_iso_week():
    res = sample(SweepSpec(samples=3), BUDGET)
    assert res.seed == dt.date.today().isocalendar().week


# --- the cap and duplicates --------------------------------------------------------------------

def test_cap_raises_with_counts():
    spec = SweepSpec(samples=5, seed=1, reference_flops_limit=1.0)  # every config costs >= 12 flops
    with pytest.raises(SamplingExhausted) as ei:
        sample(spec, 1 << 60)  # no split-KV rejections: every draw fails reference_flops
    e = ei.value
    assert e.cap == 5000 and e.accepted == 0 and sum(e.filtered.values()) == 5000
    assert e.filtered["reference_flops"] == 5000
    msg = str(e)
    assert "cap of 5000 draws" in msg and "0 of 5 configs accepted" in msg and "reference_flops=5000" in msg


def test_cap_from_max_draws_counts_partial_progress():
    # max_tokens=1 admits only g = Sq = Sk = 1: a few pass in 40 draws, not 30
    spec = SweepSpec(samples=30, seed=4, max_tokens=1, max_draws=40)
    with pytest.raises(SamplingExhausted) as ei:
        sample(spec, BUDGET)
    e = ei.value
    assert e.cap == 40 and 0 < e.accepted < 30
    assert sum(e.filtered.values()) == 40 - e.accepted and e.filtered["max_tokens"] > 0
    assert f"with {e.accepted} of 30 configs accepted" in str(e)


def _tiny(seed: int) -> AttentionConfig:
    return AttentionConfig(dtype="f16", g=1, seq_len_q=1, seq_len_k=1, num_heads_q=1, num_heads_kv=1,
                           head_dim_qk=1, head_dim_v=1, data_seed=seed)


def test_duplicates_are_skipped_and_counted():
    # a draw function over a space of 3 configs: the 4th distinct one never comes
    draw = lambda rng: _tiny(int(rng.integers(3)))  # noqa: E731
    p = Prefilter(max_tokens=16384, splitkv_budget=GIB, reference_flops_limit=2e10, reference_bytes_limit=GIB)
    res = collect_configs(draw, np.random.default_rng(0), p, samples=3, cap=1000, seed=0)
    assert sorted(c.data_seed for c in res.configs) == [0, 1, 2]
    assert res.filtered["duplicate"] == res.draws - 3 > 0
    with pytest.raises(SamplingExhausted) as ei:
        collect_configs(draw, np.random.default_rng(0), p, samples=4, cap=50, seed=0)
    assert ei.value.accepted == 3 and ei.value.filtered["duplicate"] == 47


# --- the default distribution (raw draws, before filters) -------------------------------------

@pytest.fixture(scope="module")
def raw_draws():
    d = ConfigDrawer(SweepSpec())
    rng = np.random.default_rng(2024)
    return [d.draw(rng) for _ in range(4000)]


def frac(xs, pred):
    xs = list(xs)
    return sum(1 for x in xs if pred(x)) / len(xs)


def test_kv_cache_mode(raw_draws):
    kv = [c for c in raw_draws if c.current_seq_len is not None]
    assert 0.46 < len(kv) / len(raw_draws) < 0.54
    for c in kv:
        assert c.seq_len_q == 1 and len(c.current_seq_len) == c.g
        assert all(0 <= v <= c.seq_len_k - 1 for v in c.current_seq_len)


def test_sizes_fit_max_tokens_and_are_log_uniform(raw_draws):
    assert all(max(c.seq_len_q, c.seq_len_k) * c.g <= 16384 for c in raw_draws)
    assert all(1 <= c.g <= 256 for c in raw_draws)
    # log-uniform seq_len_k over [1, 16384]: P(Sk <= 16) = log(17)/log(16385) ~ 0.29
    assert 0.25 < frac(raw_draws, lambda c: c.seq_len_k <= 16) < 0.33
    assert 0.25 < frac(raw_draws, lambda c: c.seq_len_k >= 1024) < 0.32
    assert max(c.seq_len_k for c in raw_draws) > 8192


def test_heads_distribution(raw_draws):
    assert 0.22 < frac(raw_draws, lambda c: (c.num_heads_q, c.num_heads_kv) == (1, 1)) < 0.28
    mha = [c for c in raw_draws if c.num_heads_q == c.num_heads_kv > 1]
    assert 0.22 < len(mha) / len(raw_draws) < 0.28
    assert {c.num_heads_q for c in mha} == {2, 4, 8, 16, 32, 64}
    gqa = [c for c in raw_draws if c.num_heads_q != c.num_heads_kv]
    assert 0.46 < len(gqa) / len(raw_draws) < 0.54
    for c in gqa:
        r = c.num_heads_q // c.num_heads_kv
        assert c.num_heads_q > c.num_heads_kv >= 2 and c.num_heads_q <= 64
        assert r & (r - 1) == 0 and 2 <= r <= 32
    assert max(c.gqa_ratio for c in gqa) == 32


def test_return_lse_and_split_kv(raw_draws):
    lse = [c for c in raw_draws if c.return_lse]
    assert 0.46 < len(lse) / len(raw_draws) < 0.54
    assert all(c.split_kv == 1 for c in raw_draws if not c.return_lse)
    counts = {s: sum(1 for c in lse if c.split_kv == s) for s in (1, 2, 4, 8, 16, 32, 64, 128)}
    assert sum(counts.values()) == len(lse)
    for s, n in counts.items():  # uniform: each ~1/8 of ~2000
        assert 0.08 < n / len(lse) < 0.17, counts


def test_dtype_head_dims_coins_prefix_seed(raw_draws):
    for d in ("f16", "bf16", "f32", "i8"):
        assert 0.21 < frac(raw_draws, lambda c: c.dtype == d) < 0.29
    for attr in ("head_dim_qk", "head_dim_v"):
        vals = [getattr(c, attr) for c in raw_draws]
        assert all(1 <= v <= 1024 for v in vals)
        in_common = sum(v in COMMON_HEAD_DIMS for v in vals) / len(vals)
        assert 0.48 < in_common < 0.6  # half from the set, plus log-uniform hits
        assert sum(v == 1 for v in vals) / len(vals) > 0.03  # log-uniform reaches 1 (~5%)
    for attr in ("with_attn_scale", "with_attn_bias", "causal", "trans_q", "trans_k", "trans_v", "trans_o"):
        assert 0.46 < frac(raw_draws, lambda c: getattr(c, attr)) < 0.54, attr
    causal = [c for c in raw_draws if c.causal]
    assert all(c.prefix_offset is None for c in raw_draws if not c.causal)
    assert 0.45 < frac(causal, lambda c: c.prefix_offset is not None) < 0.55
    for c in causal:
        if c.prefix_offset is None:
            continue
        if c.current_seq_len is not None:
            assert c.prefix_offset == c.current_seq_len
        else:
            assert len(c.prefix_offset) == c.g and all(0 <= p <= c.seq_len_k - 1 for p in c.prefix_offset)
    seeds = [c.data_seed for c in raw_draws]
    assert all(0 <= s < 2**31 for s in seeds) and len(set(seeds)) == len(seeds) and max(seeds) > 2**30


def test_accepted_quarter_long_keys_under_defaults():
    res = sample(SweepSpec(samples=3000, seed=99), BUDGET)
    assert 0.2 < frac(res.configs, lambda c: c.seq_len_k >= 1024) < 0.32
    assert res.filtered["max_tokens"] == 0  # sizes are drawn to fit


# --- range overrides ---------------------------------------------------------------------------

def test_range_overrides_respected():
    ranges = {"g": (2, 4), "seq_len_k": (100, 200), "num_heads_q": (8, 16), "num_heads_kv": (2, 8),
              "head_dim_qk": (64, 64), "head_dim_v": (16, 40), "split_kv": (4, 16), "seq_len_q": (1, 1)}
    res = sample(SweepSpec(samples=400, seed=8, ranges=ranges), BUDGET)
    cs = res.configs
    for c in cs:
        assert 2 <= c.g <= 4 and 100 <= c.seq_len_k <= 200 and c.seq_len_q == 1
        assert c.num_heads_q in (8, 16) and c.num_heads_kv in (2, 4, 8) and c.num_heads_q >= c.num_heads_kv
        assert c.head_dim_qk == 64 and 16 <= c.head_dim_v <= 40
        assert c.return_lse and c.split_kv in (4, 8, 16)  # 1 excluded: return_lse forced
    assert {c.split_kv for c in cs} == {4, 8, 16}
    assert any(c.num_heads_q == c.num_heads_kv for c in cs) and any(c.num_heads_q > c.num_heads_kv for c in cs)
    assert 0.3 < frac(cs, lambda c: c.head_dim_v == 32) < 0.7  # the only common dim in range
    assert 0.35 < frac(cs, lambda c: c.current_seq_len is not None) < 0.65


def test_pinned_coins_hold_and_leave_every_other_draw_as_it_was():
    """trans_q=0 trans_k=0 trans_v=0 (the layouts of the tensor-core path): those fields fixed,
    everything else of each config the unpinned sweep's (the coins are still drawn)."""
    pins = {"trans_q": (0, 0), "trans_k": (0, 0), "trans_v": (0, 0)}
    free = sample(SweepSpec(samples=300, seed=9, max_tokens=4096), BUDGET)
    pinned = sample(SweepSpec(samples=300, seed=9, max_tokens=4096, ranges=pins), BUDGET)
    assert all(not (c.trans_q or c.trans_k or c.trans_v) for c in pinned.configs)
    assert 0.35 < frac(free.configs, lambda c: c.trans_k) < 0.65
    unpin = {"trans_q": False, "trans_k": False, "trans_v": False}
    assert [AttentionConfig(**{**c.model_dump(), **unpin}) for c in free.configs] == pinned.configs
    on = sample(SweepSpec(samples=200, seed=9, ranges={"causal": (1, 1), "with_attn_bias": (0, 0)}), BUDGET)
    assert all(c.causal and not c.with_attn_bias for c in on.configs)
    assert 0.35 < frac(on.configs, lambda c: c.trans_o) < 0.65          # the others stay coins
    assert parse_ranges(["trans_k=0", "with_attn_bias=0:1"]) == {"trans_k": (0, 0), "with_attn_bias": (0, 1)}


def test_seq_len_q_override_without_one_disables_kv_cache_and_g_lo_survives_max_tokens():
    res = sample(SweepSpec(samples=200, seed=9, ranges={"seq_len_q": (2, 8)}), BUDGET)
    assert all(c.current_seq_len is None and 2 <= c.seq_len_q <= 8 for c in res.configs)
    res = sample(SweepSpec(samples=50, seed=9, ranges={"g": (8, 8)}), BUDGET)
    assert all(c.g == 8 for c in res.configs)
    assert res.filtered["max_tokens"] > 0  # Sk > 2048 cannot fit g = 8


def test_heads_override_can_extend_beyond_default():
    res = sample(SweepSpec(samples=50, seed=1, ranges={"num_heads_q": (128, 128), "num_heads_kv": (1, 128)}), BUDGET)
    assert all(c.num_heads_q == 128 for c in res.configs)
    assert {c.num_heads_kv for c in res.configs} <= {2, 4, 8, 16, 32, 64, 128}


# --- speed -------------------------------------------------------------------------------------

def test_ten_thousand_configs_sample_fast():
    t = time.perf_counter()
    res = sample(SweepSpec(samples=10_000, seed=1), BUDGET)
    assert len(res.configs) == 10_000
    assert time.perf_counter() - t < 10.0  # ~0.5 s measured; generous for a loaded 2-core box
