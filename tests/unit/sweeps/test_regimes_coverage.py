"""Regime mix, coverage cells and coverage-guided sampling (docs/spec.md §6); the cpu backend
on every regime (docs/spec.md §5: zero false failures)."""
from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from attnconfig import parse_config
from attnconfig.regimes import REGIMES
from kernels import get_backend
from sweeps.coverage import CellCounts, cell_space, cells_of, config_features, coverage_report, coverage_summary, possible
from sweeps.policy import gates_for
from sweeps.runner import run_config
from sweeps.regime_mix import REGIME_MIX
from sweeps.sampler import sample
from sweeps.spec import SweepSpecError, parse_sweep_spec

BUDGET = 3 << 29


def test_normal_only_mix_is_the_sweep_of_before():
    # Digests of sample(seed=5, 300 configs) taken before data_regime existed.
    r = sample(parse_sweep_spec(dict(samples=300, seed=5, backend="cpu", data_regimes=["normal"])), BUDGET)
    assert hashlib.sha256("\n".join(c.to_json() for c in r.configs).encode()).hexdigest()[:32] == \
        "ed9ed13ecae5b8e4b6f9df29a051093b"
    assert hashlib.sha256(",".join(r.accepted_hashes).encode()).hexdigest()[:32] == "7fb8c4a0e2f908a676da42e518a9b842"


def test_the_regime_mix_changes_regimes_only_and_is_reproducible():
    plain = sample(parse_sweep_spec(dict(samples=400, seed=9, data_regimes=["normal"])), BUDGET).configs
    mixed = sample(parse_sweep_spec(dict(samples=400, seed=9, data_regimes=REGIME_MIX)), BUDGET).configs
    again = sample(parse_sweep_spec(dict(samples=400, seed=9, data_regimes=REGIME_MIX)), BUDGET).configs
    assert [c.to_json() for c in mixed] == [c.to_json() for c in again]
    assert [c.model_copy(update={"data_regime": "normal"}) for c in mixed] == plain
    share = Counter(c.data_regime for c in mixed)
    assert set(share) == set(REGIMES) and 150 <= share["normal"] <= 250


def test_a_request_without_regimes_draws_the_regime_mix():
    default = sample(parse_sweep_spec(dict(samples=400, seed=9)), BUDGET).configs
    mixed = sample(parse_sweep_spec(dict(samples=400, seed=9, data_regimes=REGIME_MIX)), BUDGET).configs
    assert [c.to_json() for c in default] == [c.to_json() for c in mixed]
    assert {c.data_regime for c in default} == set(REGIMES)


@pytest.mark.parametrize("value, field, rule", [
    ({"spiky": 1}, "data_regimes.spiky", "unknown regime 'spiky'"),
    ({"sink": 0}, "data_regimes.sink", "a share must be a finite number > 0"),
    ([], "data_regimes", "at least one regime"),
    (["sink", "sink"], "data_regimes", "must not repeat"),
])
def test_regime_mix_errors_name_field_and_rule(value, field, rule):
    with pytest.raises(SweepSpecError) as err:
        parse_sweep_spec({"data_regimes": value})
    assert (field, ) == tuple(f for f, _ in err.value.problems) and rule in str(err.value)


def test_regime_bounds_grow_with_logits_and_leave_normal_alone():
    base = dict(dtype="i8", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=1, num_heads_kv=1, head_dim_qk=64,
                head_dim_v=64, return_lse=True, data_seed=3)
    normal = gates_for(parse_config(base))
    assert (normal["row"], normal["lse"]) == (4e-3, 4e-2)
    large = gates_for(parse_config({**base, "data_regime": "large_logits"}))
    assert large["lse"] >= 0.125 and large["row"] >= normal["row"]  # an f16 ulp at |LSE| >= 128
    uniform = gates_for(parse_config({**base, "dtype": "bf16", "data_regime": "uniform"}))
    assert uniform["rms_reason"] == "uniform_attention" and uniform["rms"] == 0.04


@pytest.mark.parametrize("regime", REGIMES)
def test_cpu_backend_passes_every_regime(regime):
    spec = parse_sweep_spec(dict(samples=12, seed=31, backend="cpu", data_regimes=[regime],
                                 ranges={"seq_len_k": (1, 700), "g": (1, 4), "seq_len_q": (1, 64)}))
    backend = get_backend("cpu")
    results = [run_config(c, backend) for c in sample(spec, BUDGET).configs]
    bad = [(r.config.to_json(), r.detail) for r in results if r.outcome != "pass"]
    assert not bad
    assert all(r.metrics["fact_max_abs_lse"] is not None for r in results)


def _config(**kw):
    base = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=100, num_heads_q=8, num_heads_kv=1, head_dim_qk=64,
                head_dim_v=64)
    return parse_config({**base, **kw})


def test_config_features_and_cells():
    c = _config(current_seq_len=[3], causal=True, prefix_offset=[3], return_lse=True, split_kv=4,
                trans_k=True, data_regime="sink")
    f = config_features(c, block_n=32)
    assert f == {"mask": "causal_prefix", "kv_cache": "yes", "gqa_ratio": "8+", "splits": "2-8",
                 "empty_splits": "yes", "head_dim": "<=64", "dtype": "f16", "layout": "transposed"}
    metrics = {"fact_masked_rows": 0, "fact_max_abs_lse": 150.0, "fact_max_abs_logit": 12.0,
               "fact_top_weight": 0.95, "fact_flatness": 90.0}
    cells = cells_of(c, "rowwise", metrics, 32)
    assert ("rowwise", "sink", "lse", ">=100") in cells and ("rowwise", "sink", "peak", "peaked") in cells
    assert ("rowwise", "sink", "logits", "10-100") in cells and len(cells) == 12
    # 200 keys are 7 blocks of 32: 4 and 3 blocks in two splits, none empty.
    assert config_features(_config(return_lse=True, split_kv=2, seq_len_k=200), 32)["empty_splits"] == "no"


def test_coverage_counts_a_hand_made_set():
    results = [
        (_config(), "pass", None, "attn_f16_qk64_v64_n32_m8_t128_grouped"),
        (_config(), "fail", None, "attn_f16_qk64_v64_n32_m8_t128_grouped"),
        (_config(dtype="i8"), "pass", None, "attn_i8_qk64_v64_n32_m1_t128"),
        (_config(data_regime="uniform", causal=True), "pass", None, "attn_f16_qk64_v64_n32_m8_t128_grouped"),
    ]
    report = coverage_report(results, paths=("grouped", "rowwise"), rare=2)
    space = cell_space(("grouped", "rowwise"))
    assert report["cells_total"] == len(space)
    cells = {(c["path"], c["regime"], c["feature"], c["value"]): c for c in report["cells"]}
    assert cells[("grouped", "normal", "dtype", "f16")]["configs"] == 2
    assert cells[("grouped", "normal", "dtype", "f16")]["failing"] == 1
    assert cells[("grouped", "normal", "dtype", "f16")]["state"] == "covered"
    assert cells[("rowwise", "normal", "dtype", "i8")]["state"] == "rare"
    assert cells[("grouped", "uniform", "mask", "causal")]["configs"] == 1
    assert cells[("grouped", "sink", "dtype", "f16")]["state"] == "never"
    assert ("grouped", "normal", "dtype", "i8") not in cells and not possible(("grouped", "normal", "dtype", "i8"))
    t = report["totals"]
    assert t["covered"] + t["rare"] + t["never"] == len(space)
    assert t["covered"] == 8 and t["rare"] == 8 + 8  # grouped normal (8 features) twice; i8 rowwise, uniform once
    assert report["outside"] == []
    assert "coverage:" in coverage_summary(report)


def test_guided_sampling_reaches_a_planted_never_covered_cell():
    target = ("rowwise", "cancellation", "gqa_ratio", "8+")
    prior = CellCounts()
    prior.configs.update({cell: 50 for cell in cell_space() if cell != target})

    def hits(guided: bool, seed: int) -> bool:
        spec = parse_sweep_spec(dict(samples=20, seed=seed, backend="cpu", coverage_guided=guided,
                                      data_regimes=REGIME_MIX))
        configs = sample(spec, BUDGET, prior=prior).configs
        return any(target in cells_of(c, "rowwise" if c.dtype == "i8" or max(c.head_dim_qk, c.head_dim_v) > 256
                                      else "grouped") for c in configs)

    guided = sum(hits(True, s) for s in range(10))
    uniform = sum(hits(False, s) for s in range(10))
    assert guided >= 9 and uniform <= 5, (guided, uniform)


def test_guided_sampling_is_deterministic():
    spec = parse_sweep_spec(dict(samples=30, seed=4, coverage_guided=True))
    a, b = sample(spec, BUDGET), sample(spec, BUDGET)
    assert [c.to_json() for c in a.configs] == [c.to_json() for c in b.configs]
    assert a.draws == sum(a.filtered.values()) + len(a.configs)
