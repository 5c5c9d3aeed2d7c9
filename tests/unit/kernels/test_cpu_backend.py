"""The cpu backend: a numpy emulation of the split-KV kernels, with its defect switches."""
import numpy as np
import pytest

from attnconfig import parse_config
from kernels.backends.base import DATA_DEFECTS, NUMERIC_DEFECTS, Backend
from kernels.backends.cpu import CpuEmulationBackend
from reference import attention_exact, attention_lowprec, attention_splitkv, make_inputs, verify_outputs


def cfg(**kw):
    base = dict(dtype="f16", g=2, seq_len_q=16, seq_len_k=200, num_heads_q=4, num_heads_kv=2,
                head_dim_qk=32, head_dim_v=16, return_lse=True, split_kv=4, data_seed=7)
    return parse_config({**base, **kw})


def run(c, defects=frozenset(), block_n=32):
    backend = CpuEmulationBackend(frozenset(defects), block_n=block_n)
    inputs = make_inputs(c)
    result = backend.run(backend.prepare(c), c, inputs)
    ref = attention_splitkv(c, inputs, block_n)
    metrics = verify_outputs(c, ref, attention_lowprec(c, inputs), result.out, result.lse,
                             result.o_partials, result.lse_partials, exact=attention_exact(c, inputs))
    return result, metrics


def test_device_info_says_it_is_an_emulation():
    info = CpuEmulationBackend().device_info()
    assert isinstance(CpuEmulationBackend(), Backend)
    assert info.backend == "cpu" and "emulation" in info.device and "no GPU" in info.device
    assert info.total_memory is None


def test_prepare_names_variants_deterministically():
    c = cfg()
    a, b = CpuEmulationBackend().prepare(c), CpuEmulationBackend().prepare(c)
    assert a.variant == b.variant == "cpu_attn_f16_bn32_dqk32_dv16"
    assert a.source_hash == b.source_hash and len(a.source_hash) == 16
    int(a.source_hash, 16)
    assert a.block_n == 32
    broken = CpuEmulationBackend(frozenset({"no_zero_sum_guard", "causal_off_by_one"}), block_n=64).prepare(c)
    assert broken.variant == "cpu_attn_f16_bn64_dqk32_dv16_defects-causal_off_by_one-no_zero_sum_guard"
    assert CpuEmulationBackend().prepare(cfg(dtype="bf16", head_dim_v=8)).variant == "cpu_attn_bf16_bn32_dqk32_dv8"


def test_unknown_defect_is_refused():
    with pytest.raises(ValueError, match="defects"):
        CpuEmulationBackend(frozenset({"bogus"}))


GOOD = {
    "f16_causal_gqa": cfg(causal=True),
    "bf16_kv_cache": cfg(dtype="bf16", seq_len_q=1, current_seq_len=[0, 150], split_kv=8),
    "f32_prefix_bias": cfg(dtype="f32", causal=True, prefix_offset=[20, 190], with_attn_bias=True, split_kv=3),
    "i8_no_scale": cfg(dtype="i8", with_attn_scale=False, split_kv=2),
    "f16_single_split": cfg(split_kv=1, return_lse=False),
    "f16_transposed": cfg(trans_q=True, trans_k=True, trans_v=True, trans_o=True, causal=True),
    "f16_more_splits_than_blocks": cfg(split_kv=64, seq_len_k=100),
}
RMS_BOUND = {"f16": 0.005, "bf16": 0.01, "f32": 1e-6, "i8": 0.005}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_correct_build_matches_the_reference(name):
    c = GOOD[name]
    result, m = run(c)
    assert result.out.shape == (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v)
    assert m["out_nonfinite"] == 0 and m["out_rms"] < RMS_BOUND[c.dtype] and m["out_row_err"] < 0.02
    assert m["out_err_ratio"] <= 2.0
    if c.return_lse:
        assert m["lse_inf_mismatch"] == 0 and m["lse_nonfinite"] == 0 and m["lse_max_abs"] < 1e-2
    else:
        assert result.lse is None
    if c.split_kv == 1:
        assert result.o_partials is None and result.lse_partials is None  # no partial buffers
    else:
        assert result.o_partials.dtype == np.float32
        assert result.o_partials.shape == (c.split_kv, c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v)
        assert m["partials_nonfinite"] == 0 and m["partials_invalid_bad"] == 0 and m["partials_row_err"] < 0.02
    assert result.run_s > 0


def test_f32_build_is_the_reference_arithmetic():
    c = cfg(dtype="f32", causal=True, split_kv=5)
    backend = CpuEmulationBackend()
    inputs = make_inputs(c)
    result = backend.run(backend.prepare(c), c, inputs)
    ref = attention_splitkv(c, inputs)
    np.testing.assert_array_equal(result.o_partials, ref.o_partials)
    np.testing.assert_array_equal(result.lse_partials, ref.lse_partials)


def test_layouts_do_not_change_the_answer():
    plain, _ = run(cfg(causal=True))
    transposed, _ = run(GOOD["f16_transposed"])
    np.testing.assert_array_equal(plain.out, transposed.out)
    np.testing.assert_array_equal(plain.lse, transposed.lse)


# Each defect with a config that triggers it, next to the correct build on the same config.

def test_no_neginf_guard_turns_invalid_causal_splits_into_nan():
    c = cfg(causal=True, seq_len_q=64, seq_len_k=128)  # row 0 sees split 0; splits 1-3 hold masked keys
    good, _ = run(c)
    bad, m = run(c, {"no_neginf_guard"})
    assert np.isfinite(good.out.astype(np.float32)).all()
    assert np.isnan(bad.out.astype(np.float32)).any() and m["out_nonfinite"] > 0
    assert m["partials_nonfinite"] > 0


def test_no_zero_sum_guard_turns_empty_splits_into_nan():
    c = cfg(seq_len_q=1, current_seq_len=[0, 199], split_kv=2)  # batch 0: 1 block, split 1 empty
    good, _ = run(c)
    bad, m = run(c, {"no_zero_sum_guard"})
    assert np.isfinite(good.out.astype(np.float32)).all()
    assert np.isnan(bad.out[0].astype(np.float32)).all() and m["out_nonfinite"] > 0
    assert np.isfinite(bad.out[1].astype(np.float32)).all()  # batch 1 has no empty split


@pytest.mark.parametrize("seq_len_k, split_kv", [(100, 8), (12 * 32, 5)])
def test_floor_blocks_per_split_gives_wrong_output(seq_len_k, split_kv):
    # 4 blocks < 8 splits: floor gives 0 blocks per split; 12 blocks / 5: floor 2 drops 2 blocks.
    c = cfg(seq_len_k=seq_len_k, split_kv=split_kv)
    _, good = run(c)
    _, m = run(c, {"floor_blocks_per_split"})
    assert good["out_rms"] < 0.005
    assert m["out_rms"] > 0.05 and m["out_row_err"] > 0.1


def test_causal_off_by_one_gives_wrong_output():
    c = cfg(causal=True)
    _, good = run(c)
    _, m = run(c, {"causal_off_by_one"})
    assert good["out_row_err"] < 0.02
    assert m["out_row_err"] > 0.5 and m["lse_inf_mismatch"] > 0  # row 0 then sees no key at all


def test_defects_do_nothing_where_they_cannot_trigger():
    c = cfg(seq_len_k=256, split_kv=4)  # non-causal, 8 blocks over 4 splits: nothing empty or invalid
    base, _ = run(c)
    for defect in set(NUMERIC_DEFECTS) - DATA_DEFECTS:
        other, _ = run(c, {defect})
        np.testing.assert_array_equal(other.out, base.out)


def test_combine_no_max_shift_is_wrong_only_where_logits_leave_exps_range():
    # Unshifted weights round differently but pass the gates while |LSE| is small; large logits
    # overflow exp(LSE_s) to inf, and the output turns NaN.
    for regime in ("normal", "uniform", "cancellation"):
        c = cfg(data_regime=regime)
        _, good = run(c)
        _, m = run(c, {"combine_no_max_shift"})
        assert m["out_nonfinite"] == 0 and m["out_row_err"] < 2 * good["out_row_err"] + 1e-3, (regime, m)
    c = cfg(data_regime="large_logits")
    _, good = run(c)
    _, m = run(c, {"combine_no_max_shift"})
    assert good["out_nonfinite"] == 0 and m["out_nonfinite"] > 0
