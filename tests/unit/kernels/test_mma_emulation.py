"""The tensor-core kernel (attention.hip attn_splitkv_fwd_mma) run on the host.

host_emu.h stands in for its NVIDIA instructions (mma.sync m16n8k16, ldmatrix, cp.async) with
the PTX ISA's fragment layouts, and the kernel runs through the very `DeviceBackend.run` the
CUDA backend uses: its decode shape (one 16-row tile, keys split over four warps whose states
merge, the fused combine), its prefill shape (four warps of one or two row tiles), Q from shared
memory at D = 256, padded and swizzled shared rows, masks, guards and the defect switches, and
the GPU suite's own cases under its own check. So a broken fragment
index, mask or split boundary in the path every NVIDIA GPU runs fails here, without a GPU.
tests/gpu runs the same kernel on the hardware.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels.cache import KernelCache
from kernels.select import select_variant
from kernels.tuning import MMA_DECODE_ROWS

from .test_variants import HostEmuBackend, _check_against_reference, _emu_run, cfg, needs_gxx

TOL = {"f16": 4e-3, "bf16": 3e-2}

# (config, what the variant must be): decode (block_m 16, key groups) or prefill (block_m 64)
CASES = [
    # decode, GQA 4: three splits, combined by the kernel's last block (fused combine)
    (dict(seq_len_q=1, num_heads_q=8, num_heads_kv=2, head_dim_qk=64, head_dim_v=64, seq_len_k=300,
          split_kv=3, return_lse=True), "decode"),
    # decode, ragged KV cache, 12 splits: past the fused combine's limit, the combine kernel
    (dict(dtype="bf16", g=2, seq_len_q=1, num_heads_q=4, num_heads_kv=1, head_dim_qk=128, head_dim_v=128,
          seq_len_k=520, current_seq_len=[0, 401], split_kv=12, return_lse=True), "decode"),
    # decode at D = 256: Q's fragments from shared memory; 64-key tiles
    (dict(seq_len_q=1, num_heads_q=2, num_heads_kv=1, head_dim_qk=256, head_dim_v=256, seq_len_k=150,
          split_kv=2, return_lse=True), "decode"),
    # decode with head dims that are no swizzle size (padded rows, dims past dqk zero-filled),
    # bias, and GQA rows of two queries each (a causal decode of 2 rows)
    (dict(seq_len_q=2, num_heads_q=6, num_heads_kv=2, head_dim_qk=40, head_dim_v=24, seq_len_k=90,
          causal=True, prefix_offset=[70], with_attn_bias=True, split_kv=2, return_lse=True), "decode"),
    # prefill, causal with a prefix, bias: 40 rows in a 64-row block, some tiles fully masked
    (dict(dtype="bf16", seq_len_q=40, num_heads_q=2, num_heads_kv=2, head_dim_qk=64, head_dim_v=64,
          seq_len_k=100, causal=True, prefix_offset=[30], with_attn_bias=True, return_lse=True), "prefill"),
    # prefill, GQA 4 of 5 queries (20 rows a kv head), split in 3 with partials, transposed O
    (dict(seq_len_q=5, num_heads_q=8, num_heads_kv=2, head_dim_qk=128, head_dim_v=128, seq_len_k=200,
          split_kv=3, return_lse=True, trans_o=True), "prefill"),
    # prefill at D = 256 (32-key tiles, Q from shared memory), causal, without the softmax scale
    (dict(seq_len_q=24, num_heads_q=1, num_heads_kv=1, head_dim_qk=256, head_dim_v=256, seq_len_k=70,
          causal=True, with_attn_scale=False), "prefill"),
]


@pytest.fixture(scope="module")
def mma_emu(tmp_path_factory):
    return HostEmuBackend(cache=KernelCache(tmp_path_factory.mktemp("kcache-mma"), enabled=True), mma=True)


@needs_gxx
@pytest.mark.parametrize("case, shape", CASES, ids=lambda x: "-".join(f"{k}={v}" for k, v in x.items())[:80]
                         if isinstance(x, dict) else x)
def test_mma_kernel_on_host_matches_reference(mma_emu, case, shape):
    c = cfg(**case)
    inputs, prepared, out = _emu_run(mma_emu, c)
    v = select_variant(c, mma=True)
    assert prepared.variant == v.name and v.path == "mma"
    assert (v.block_m == MMA_DECODE_ROWS) == (shape == "decode")
    _check_against_reference(c, inputs, out, prepared.block_n, TOL[c.dtype])


@needs_gxx
def test_mma_kernel_two_level_fused_combine_on_host(mma_emu, monkeypatch):
    """40 splits with the fused combine allowed past 8: groups of splits combined into group
    partials by their last block, those by the last group's (measured slower than the combine
    kernel: kernels/tuning.py FUSED_COMBINE_MAX_SPLITS keeps it off by default)."""
    from kernels import launch

    monkeypatch.setattr(launch, "FUSED_COMBINE_MAX_SPLITS", 1024)
    c = cfg(seq_len_q=1, num_heads_q=4, num_heads_kv=1, head_dim_qk=64, head_dim_v=64, seq_len_k=1300,
            split_kv=40, return_lse=True)
    v = select_variant(c, mma=True)
    assert launch.fuses_combine(c, v) and mma_emu.combine_counters(c, v) > 1
    inputs, prepared, out = _emu_run(mma_emu, c)
    _check_against_reference(c, inputs, out, prepared.block_n, TOL[c.dtype])


@needs_gxx
def test_mma_kernel_defects_show_their_symptoms_on_host(tmp_path):
    """Each defect switch compiled into the tensor-core kernel shows the symptom it showed in
    rocMLIR (the portable kernels' test, test_variants.py, does the same on their paths)."""
    from reference.exact import attention_exact

    cache = KernelCache(tmp_path, enabled=True)
    c_causal = cfg(causal=True, seq_len_q=3, seq_len_k=70, split_kv=4, return_lse=True)
    c_small = cfg(seq_len_q=2, seq_len_k=20, split_kv=4, return_lse=True)
    # a prefill (64-row blocks): the -inf guard's symptom needs the fully masked tiles walked
    c_prefill = cfg(causal=True, seq_len_q=40, num_heads_q=1, seq_len_k=128, split_kv=2, return_lse=True)
    expect = {
        "no_neginf_guard": [(c_causal, "nan"), (c_prefill, "nan")],
        "floor_blocks_per_split": [(c_small, "wrong")],
        "no_zero_sum_guard": [(c_small, "nan")],
        "causal_off_by_one": [(c_causal, "wrong"), (c_prefill, "wrong")],
    }
    for defect, cases in expect.items():
        backend = HostEmuBackend({defect}, cache=cache, mma=True)
        for c, symptom in cases:
            inputs, prepared, out = _emu_run(backend, c)
            assert defect in prepared.variant and "_mma" in prepared.variant
            o_ref, _ = attention_exact(c, inputs)
            o = out.out.astype(np.float64)
            if symptom == "nan":
                assert np.isnan(o).any(), (defect, c)
            else:
                assert not np.isnan(o).any(), (defect, c)
                assert np.abs(o - o_ref).max() > 0.05, (defect, c)


class Exp2Emu(HostEmuBackend):
    """Every mma variant built with ATTN_MMA_EXP2=1, decode included (MMA_PREFILL_TABLE turns it on
    for small prefill tiles only); a backend of its own, since a backend keeps what it loaded by
    variant name and the macro does not change the name."""

    def compile_options(self, variant):
        return [*super().compile_options(variant), "-DATTN_MMA_EXP2=1"]


@pytest.fixture(scope="module")
def mma_emu_exp2(tmp_path_factory):
    return Exp2Emu(cache=KernelCache(tmp_path_factory.mktemp("kcache-exp2"), enabled=True), mma=True)


@needs_gxx
@pytest.mark.parametrize("case, shape", CASES, ids=lambda x: "-".join(f"{k}={v}" for k, v in x.items())[:80]
                         if isinstance(x, dict) else x)
def test_mma_kernel_with_exp2_softmax_on_host(mma_emu_exp2, case, shape):
    """ATTN_MMA_EXP2=1: the scores' exponent as one FFMA, the row maximum of fully visible
    tiles on the unscaled scores; outputs, LSE and partials as the reference's."""
    c = cfg(**case)
    inputs, prepared, out = _emu_run(mma_emu_exp2, c)
    _check_against_reference(c, inputs, out, prepared.block_n, TOL[c.dtype])


@needs_gxx
def test_mma_exp2_softmax_keeps_the_guards_symptom_on_host(tmp_path):
    c = cfg(causal=True, seq_len_q=40, num_heads_q=1, seq_len_k=128, split_kv=2, return_lse=True)
    _, _, out = _emu_run(Exp2Emu({"no_neginf_guard"}, cache=KernelCache(tmp_path, enabled=True), mma=True), c)
    assert np.isnan(out.out.astype(np.float64)).any()


# Prefill cases whose head dims take 128-key tiles (MMA_PREFILL_TABLE): the causal diagonal, the
# last partial tile and the split boundaries fall inside one tile
PREFILL_CASES = [
    # causal with a prefix and bias: 100 rows in two 64-row blocks, tiles above the diagonal skipped
    dict(dtype="bf16", seq_len_q=100, num_heads_q=1, num_heads_kv=1, head_dim_qk=64, head_dim_v=64,
         seq_len_k=160, causal=True, prefix_offset=[50], with_attn_bias=True, return_lse=True),
    # GQA 3 of 50 queries (150 rows a kv head: a third, mostly empty block), split in two
    dict(seq_len_q=50, num_heads_q=3, num_heads_kv=1, head_dim_qk=128, head_dim_v=128, seq_len_k=130,
         split_kv=2, return_lse=True),
    # head dims of no swizzle size (padded rows), ragged keys
    dict(g=2, seq_len_q=20, num_heads_q=2, num_heads_kv=2, head_dim_qk=40, head_dim_v=72, seq_len_k=90,
         current_seq_len=[89, 33], return_lse=True),
]


@needs_gxx
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda x: "-".join(f"{k}={v}" for k, v in x.items())[:80])
def test_mma_prefill_with_128_key_tiles_on_host(mma_emu, case):
    c = cfg(**case)
    v = select_variant(c, mma=True)
    assert (v.block_m, v.tile_n) == (64, 128) and "_k128_" in v.name
    inputs, prepared, out = _emu_run(mma_emu, c)
    assert prepared.variant == v.name
    _check_against_reference(c, inputs, out, prepared.block_n, TOL[c.dtype])


def _gpu_suite():
    """tests/gpu/test_cuda_backend.py, loaded by its path (tests/gpu is no package), once."""
    name = "attnsweep_gpu_suite"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "gpu/test_cuda_backend.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


# tests/gpu/test_cuda_backend.py's cases and checks (its GPU tests do not run here)
GPU_SUITE = _gpu_suite()
# One config per feature of the GPU suite's matrix (f16 and bf16 in turn), made eligible for the
# mma path as the GPU suite does (as_mma), and its mma corner cases, all but the few whose key
# tiles would take the emulation more than a few seconds (a 16-row tile by 64 keys by the head
# dims, summed over the blocks).
_N_FEATURES = len(GPU_SUITE.CASES) // 4
GPU_SUITE_CASES = [c for c in ([GPU_SUITE.MMA_CASES[4 * i + i % 2] for i in range(_N_FEATURES)]
                               + GPU_SUITE.MMA_CASES[4 * _N_FEATURES:])
                   if c.g * c.num_heads_kv * -(-c.gqa_ratio * c.seq_len_q // 16) * -(-c.seq_len_k // 64)
                   * (c.head_dim_qk + c.head_dim_v) <= 20_000]


@needs_gxx
def test_the_gpu_suites_mma_cases_pass_its_checks_on_host(mma_emu):
    """The GPU suite's check (verify_outputs against the float64 exact reference and the split-KV
    reference, its bounds per dtype) on its own feature matrix and mma corner cases."""
    assert len(GPU_SUITE_CASES) >= 30
    bad = GPU_SUITE._failing_on(mma_emu, GPU_SUITE_CASES, "mma")
    assert not bad, bad[:3]
