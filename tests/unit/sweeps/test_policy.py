"""Tolerance policy and gates of docs/spec.md §5."""
from __future__ import annotations

import math

import pytest

from attnconfig.config import AttentionConfig
from sweeps.policy import (
    GATE_BOUNDS,
    evaluate,
    evaluate_with_gates,
    gates_for,
    rms_threshold,
    strict_rms_threshold,
)

UP, DOWN = math.inf, -math.inf


def cfg(**kw) -> AttentionConfig:
    base = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=1,
                head_dim_qk=64, head_dim_v=64)
    base.update(kw)
    return AttentionConfig(**base)


def good_metrics(**kw):
    m = dict(out_rms=1e-4, out_row_err=1e-4, out_max_abs=1e-3, out_max_rel=1e-3, out_nonfinite=0,
             out_err_ratio=1.0, lse_rms=None, lse_max_abs=None, lse_row_err=None, lse_inf_mismatch=None,
             lse_nonfinite=None, partials_row_err=None, partials_lse_max_abs=None,
             partials_invalid_bad=None, partials_nonfinite=None)
    m.update(kw)
    return m


def lse_metrics(**kw):
    base = dict(lse_rms=1e-7, lse_max_abs=1e-6, lse_row_err=1e-7, lse_inf_mismatch=0, lse_nonfinite=0)
    base.update(kw)
    return good_metrics(**base)


def partial_metrics(**kw):
    base = dict(partials_row_err=1e-4, partials_lse_max_abs=1e-6, partials_invalid_bad=0, partials_nonfinite=0)
    base.update(kw)
    return lse_metrics(**base)


def ev(c, m, err_ratio_gate=None):
    t, r = rms_threshold(c)
    return evaluate(c, m, rms_threshold=t, threshold_reason=r, err_ratio_gate=err_ratio_gate)


# --- thresholds -------------------------------------------------------------------------------

def test_threshold_order_explicit_saturated_bf16_default():
    sat_bf16 = dict(dtype="bf16", with_attn_scale=False, head_dim_qk=128)
    assert rms_threshold(cfg(rms_threshold=0.3, **sat_bf16)) == (0.3, "explicit")
    assert rms_threshold(cfg(**sat_bf16)) == (0.15, "saturated_softmax")
    assert rms_threshold(cfg(dtype="bf16", head_dim_qk=128)) == (0.01, "bf16")
    for d in ("f16", "f32", "i8"):
        assert rms_threshold(cfg(dtype=d)) == (0.005, "default")


def test_saturated_needs_unscaled_and_head_dim_above_64():
    assert rms_threshold(cfg(with_attn_scale=False, head_dim_qk=64)) == (0.005, "default")
    assert rms_threshold(cfg(with_attn_scale=False, head_dim_qk=65)) == (0.15, "saturated_softmax")
    assert rms_threshold(cfg(with_attn_scale=True, head_dim_qk=1024)) == (0.005, "default")


def test_strict_thresholds():
    assert strict_rms_threshold(cfg(dtype="f16")) == (1e-3, "strict")
    assert strict_rms_threshold(cfg(dtype="bf16")) == (1e-3, "strict")
    assert strict_rms_threshold(cfg(dtype="i8")) == (1e-3, "strict")
    assert strict_rms_threshold(cfg(dtype="f32")) == (3e-5, "strict")
    assert strict_rms_threshold(cfg(dtype="f32", rms_threshold=0.005)) == (0.005, "explicit")


def test_gate_bounds_table_shape_and_sanity():
    assert set(GATE_BOUNDS) == {"f16", "bf16", "f32", "i8"}
    out_ulp = {"f16": 2**-10, "bf16": 2**-7, "f32": 2**-23, "i8": 2**-10}
    for d, b in GATE_BOUNDS.items():
        assert set(b) == {"row_err", "lse_max_abs"}
        # a correct kernel may be off by an output ulp or two; a grossly wrong row (0.1+) fails
        assert 2 * out_ulp[d] <= b["row_err"] < 0.1
        assert 0 < b["lse_max_abs"] < 0.1


# --- each gate just over / just under ---------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_rms_gate_boundary(dtype):
    c = cfg(dtype=dtype)
    t, _ = rms_threshold(c)
    assert ev(c, good_metrics(out_rms=t)).outcome == "pass"
    assert ev(c, good_metrics(out_rms=math.nextafter(t, DOWN))).outcome == "pass"
    v = ev(c, good_metrics(out_rms=math.nextafter(t, UP)))
    assert (v.outcome, v.failed_gate) == ("fail", "rms")
    assert "out_rms" in v.detail and f"{t:.6g}" in v.detail


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_row_gate_boundary(dtype):
    c = cfg(dtype=dtype)
    b = GATE_BOUNDS[dtype]["row_err"]
    assert ev(c, good_metrics(out_row_err=math.nextafter(b, DOWN))).outcome == "pass"
    v = ev(c, good_metrics(out_row_err=math.nextafter(b, UP)))
    assert (v.outcome, v.failed_gate) == ("fail", "row")
    assert "out_row_err" in v.detail and v.gates["row"] == b


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "i8"])
def test_lse_gate_boundary_and_inf_mismatch(dtype):
    c = cfg(dtype=dtype, return_lse=True)
    b = GATE_BOUNDS[dtype]["lse_max_abs"]
    assert ev(c, lse_metrics(lse_max_abs=math.nextafter(b, DOWN))).outcome == "pass"
    v = ev(c, lse_metrics(lse_max_abs=math.nextafter(b, UP)))
    assert (v.outcome, v.failed_gate) == ("fail", "lse")
    v = ev(c, lse_metrics(lse_inf_mismatch=1))
    assert (v.outcome, v.failed_gate) == ("fail", "lse")
    assert "lse_inf_mismatch" in v.detail


def test_lse_gate_skipped_without_return_lse():
    c = cfg(return_lse=False)
    v = ev(c, good_metrics(lse_max_abs=5.0, lse_inf_mismatch=3))
    assert v.outcome == "pass" and "lse" not in v.gates


def test_partials_gate():
    c = cfg(return_lse=True, split_kv=4)
    b = GATE_BOUNDS["f16"]["row_err"]
    assert ev(c, partial_metrics(partials_row_err=math.nextafter(b, DOWN))).outcome == "pass"
    v = ev(c, partial_metrics(partials_row_err=math.nextafter(b, UP)))
    assert (v.outcome, v.failed_gate) == ("fail", "partials")
    v = ev(c, partial_metrics(partials_invalid_bad=1))
    assert (v.outcome, v.failed_gate) == ("fail", "partials")
    assert "partials_invalid_bad" in v.detail
    lb = GATE_BOUNDS["f16"]["lse_max_abs"]
    v = ev(c, partial_metrics(partials_lse_max_abs=math.nextafter(lb, UP)))
    assert (v.outcome, v.failed_gate) == ("fail", "partials")
    # not exposed: not judged
    assert ev(c, lse_metrics()).outcome == "pass"


def test_err_ratio_reported_not_gating_unless_asked():
    c = cfg()
    assert ev(c, good_metrics(out_err_ratio=1e6)).outcome == "pass"
    assert ev(c, good_metrics(out_err_ratio=2.0), err_ratio_gate=2.0).outcome == "pass"
    v = ev(c, good_metrics(out_err_ratio=math.nextafter(2.0, UP)), err_ratio_gate=2.0)
    assert (v.outcome, v.failed_gate) == ("fail", "err_ratio")
    assert v.gates["err_ratio"] == 2.0


def test_gates_checked_in_order():
    c = cfg(return_lse=True, split_kv=2)
    all_bad = partial_metrics(out_rms=1.0, out_row_err=1.0, lse_max_abs=9.0, partials_row_err=1.0, out_err_ratio=99.0)
    order = []
    m = dict(all_bad)
    fixes = {"rms": dict(out_rms=1e-5), "row": dict(out_row_err=1e-5), "lse": dict(lse_max_abs=1e-7),
             "partials": dict(partials_row_err=1e-5), "err_ratio": dict(out_err_ratio=1.0)}
    while True:
        v = ev(c, m, err_ratio_gate=3.0)
        if v.outcome == "pass":
            break
        order.append(v.failed_gate)
        m.update(fixes[v.failed_gate])
    assert order == ["rms", "row", "lse", "partials", "err_ratio"]


def test_nan_metric_value_fails_its_gate():
    v = ev(cfg(), good_metrics(out_rms=float("nan")))
    assert (v.outcome, v.failed_gate) == ("fail", "rms")


# --- nan classification -----------------------------------------------------------------------

@pytest.mark.parametrize("key, gate", [("out_nonfinite", "rms"), ("lse_nonfinite", "lse"),
                                       ("partials_nonfinite", "partials")])
def test_nonfinite_is_nan_named_after_where_found(key, gate):
    c = cfg(return_lse=True, split_kv=2)
    v = ev(c, partial_metrics(**{key: 3}))
    assert (v.outcome, v.failed_gate) == ("nan", gate)
    assert f"{key}=3" in v.detail


def test_nan_beats_failing_gates_and_out_is_named_first():
    c = cfg(return_lse=True, split_kv=2)
    v = ev(c, partial_metrics(out_rms=1.0, out_nonfinite=1, partials_nonfinite=5))
    assert (v.outcome, v.failed_gate) == ("nan", "rms")
    v = ev(c, partial_metrics(lse_max_abs=9.0, lse_nonfinite=1, partials_nonfinite=5))
    assert (v.outcome, v.failed_gate) == ("nan", "lse")


def test_missing_metric_for_active_gate_raises():
    with pytest.raises(ValueError, match="lse_max_abs"):
        ev(cfg(return_lse=True), good_metrics())
    with pytest.raises(ValueError, match="out_err_ratio"):
        ev(cfg(), good_metrics(out_err_ratio=None), err_ratio_gate=2.0)


# --- gates for reproducers --------------------------------------------------------------------

def test_gates_for_contents_and_reproducer_round_trip():
    c = cfg(dtype="bf16", return_lse=True, split_kv=2)
    g = gates_for(c, err_ratio_gate=4.0)
    assert g == {"rms": 0.01, "rms_reason": "bf16", "row": GATE_BOUNDS["bf16"]["row_err"],
                 "lse": GATE_BOUNDS["bf16"]["lse_max_abs"], "err_ratio": 4.0}
    assert set(gates_for(cfg())) == {"rms", "rms_reason", "row"}
    assert gates_for(c, strict=True)["rms"] == 1e-3
    assert gates_for(c, rms_threshold=0.02)["rms_reason"] == "explicit"
    for m in (partial_metrics(), partial_metrics(out_rms=0.0101), partial_metrics(partials_invalid_bad=2)):
        a = ev(c, m, err_ratio_gate=4.0)
        b = evaluate_with_gates(c, m, g)
        assert (a.outcome, a.failed_gate, a.detail, a.gates) == (b.outcome, b.failed_gate, b.detail, b.gates)


def test_custom_bounds_table_is_applied():
    c = cfg(dtype="f32")
    t, r = rms_threshold(c)
    bounds = {"f32": {"row_err": 0.5, "lse_max_abs": 0.5}}
    v = evaluate(c, good_metrics(out_row_err=0.4), rms_threshold=t, threshold_reason=r, bounds=bounds)
    assert v.outcome == "pass" and v.gates["row"] == 0.5
    assert ev(c, good_metrics(out_row_err=0.4)).failed_gate == "row"
