"""Kernel variants: naming and bucketing, launch plans, and the kernel source itself run on the host.

The second half runs kernels/src/attention.hip on the `hostemu` backend (kernels/backends/hostemu.py: g++
and hip_compat.h's host-emulation branch, std::threads standing in for one thread block), which
drives it through the very `DeviceBackend.run` the CUDA and HIP backends use — buffers, NaN prefill, strides, argument
packing, the combine — so the kernels' arithmetic, guards and defect switches are tested on a
machine without a GPU. tests/gpu/ repeats the matrix on a real GPU.
"""
from __future__ import annotations

import hashlib
import itertools
import shutil

import numpy as np
import pytest

import kernels.backends.hostemu
from attnconfig import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes
from kernels.backends.base import DEFECTS, CompileError, DeviceInfo, NotApplicable
from kernels.cache import KernelCache
from kernels.backends.device import nan_fill_pattern
from kernels.launch import combine_launch, fwd_launch, pack_kernel_params, physical_strides
from kernels.select import (
    GENERAL_BUCKET,
    HEAD_DIM_BUCKETS,
    Variant,
    defect_macro,
    head_dim_bucket,
    select_variant,
)
from kernels.source import SRC_DIR, load_sources


def cfg(**kw) -> AttentionConfig:
    base = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=40, num_heads_q=2, num_heads_kv=1,
                head_dim_qk=16, head_dim_v=16)
    base.update(kw)
    return AttentionConfig(**base)


# ---- naming and bucketing -------------------------------------------------------------------
def test_head_dim_buckets_cover_every_size():
    assert [head_dim_bucket(d) for d in (1, 32, 33, 64, 65, 128, 129, 256)] == [32, 32, 64, 64, 128, 128, 256, 256]
    for d in (257, 512, 1000, 1024):
        assert head_dim_bucket(d) == GENERAL_BUCKET
    for d in range(1, 1025):
        b = head_dim_bucket(d)
        assert b == GENERAL_BUCKET or d <= b
    with pytest.raises(ValueError):
        head_dim_bucket(1025)


def test_variant_name_holds_every_compile_time_parameter():
    v = select_variant(cfg(dtype="bf16", head_dim_qk=80, head_dim_v=300))
    assert v.name == "attn_bf16_qk128_vany_n32_m1_t128"
    assert v.fwd_expr == "attn_splitkv_fwd<__hip_bfloat16, 128, 0, 32, 128>"
    assert v.combine_expr == "attn_splitkv_combine<__hip_bfloat16, float, 256>"
    i8 = select_variant(cfg(dtype="i8"))
    assert i8.combine_expr == "attn_splitkv_combine<__half, __half, 256>"
    # f16/bf16/f32 with head dims <= 256 take the grouped path: 4 of the 2 heads x 4 rows per block
    gr = select_variant(cfg(dtype="f32", head_dim_qk=100, head_dim_v=64))
    assert gr.name == "attn_f32_qk128_v64_n32_m4_t128_grouped"
    assert gr.fwd_expr == "attn_splitkv_fwd_grouped<float, 128, 64, 32, 128, 4>"
    assert select_variant(cfg(seq_len_q=1, num_heads_q=3, num_heads_kv=1)).block_m == 4
    assert select_variant(cfg(seq_len_q=1, num_heads_q=1)).block_m == 1
    assert select_variant(cfg(dtype="f32"), path="rowwise").name == "attn_f32_qk32_v32_n32_m1_t128"
    with pytest.raises(NotApplicable):
        select_variant(cfg(dtype="i8"), path="grouped")
    assert i8.fwd_expr.startswith("attn_splitkv_fwd<signed char, 32, 32,")
    d = select_variant(cfg(), frozenset({"no_zero_sum_guard", "causal_off_by_one"}))
    assert d.name.endswith("_defect-causal_off_by_one-no_zero_sum_guard")
    assert d.macro_options() == ["-DATTN_DEFECT_CAUSAL_OFF_BY_ONE=1", "-DATTN_DEFECT_NO_ZERO_SUM_GUARD=1"]
    # every distinct parameter set gets a distinct name
    names = {Variant(dt, a, b, defects=df).name for dt in ("f16", "bf16", "f32", "i8")
             for a in (*HEAD_DIM_BUCKETS, 0) for b in (*HEAD_DIM_BUCKETS, 0)
             for df in ((), ("no_neginf_guard",), ("floor_blocks_per_split", "no_neginf_guard"))}
    assert len(names) == 4 * 25 * 3
    grouped = {Variant(dt, a, b, block_m=m, path="grouped").name for dt in ("f16", "bf16", "f32")
               for a in HEAD_DIM_BUCKETS for b in HEAD_DIM_BUCKETS for m in (1, 2, 4, 8)}
    assert len(grouped) == 3 * 16 * 4 and not grouped & names
    for n in names:
        assert all(ch.isalnum() or ch in "_-" for ch in n)


def test_configs_sharing_a_binary_share_a_variant():
    a = select_variant(cfg(seq_len_k=7, split_kv=1, head_dim_qk=40))
    b = select_variant(cfg(seq_len_k=9000, split_kv=16, return_lse=True, causal=True, head_dim_qk=64))
    assert a == b and a.name == b.name


def test_every_defect_has_a_macro_the_source_tests():
    source, _, _ = load_sources()
    for name in DEFECTS:
        assert f"#ifdef {defect_macro(name)}" in source or f"#ifndef {defect_macro(name)}" in source
    with pytest.raises(ValueError):
        defect_macro("nope")


def test_source_hash_changes_with_the_source():
    _, _, h = load_sources()
    text = (SRC_DIR / "attention.hip").read_text()
    manual = hashlib.sha256()
    for name, t in [("attention.hip", text), ("hip_compat.h", (SRC_DIR / "hip_compat.h").read_text())]:
        manual.update(name.encode() + b"\0" + t.encode() + b"\0")
    assert h == manual.hexdigest()


def test_select_variant_not_applicable_only_past_launch_limits():
    with pytest.raises(NotApplicable) as e:
        select_variant(cfg(split_kv=70000, return_lse=True))
    assert e.value.reason == "grid_too_large"


def test_physical_strides_match_numpy():
    for trans in (False, True):
        shape = (2, 3, 5, 7) if not trans else (2, 3, 7, 5)   # [g,H,seq,dim] / [g,H,dim,seq]
        arr = np.zeros(shape, dtype=np.float32)
        sb, sh, ss, sd = physical_strides((2, 3), 5, 7, trans)
        logical = np.swapaxes(arr, -1, -2) if trans else arr
        assert tuple(s // 4 for s in logical.strides) == (sb, sh, ss, sd)


def test_launch_plans():
    c = cfg(split_kv=4, return_lse=True, trans_q=True, trans_o=True, with_attn_scale=False)
    v = select_variant(c, path="rowwise")
    buf = {"q": 1, "k": 2, "v": 3, "o": 4, "lse": 5, "o_part": 6, "lse_part": 7}
    f = fwd_launch(c, v, buf)
    assert f.grid == (1 * 2 * 4, 4, 1) and f.block == (128, 1, 1)
    vals = [a.value for a in f.args]
    assert vals[4] is None and vals[5] is None          # final O/LSE not written by the split kernel
    assert vals[6] == 6 and vals[7] == 7
    assert len(f.args) == 39
    cl = combine_launch(c, v, buf)
    assert cl.grid == (8, 1, 1) and cl.block == (256, 1, 1) and [a.value for a in cl.args][:4] == [6, 7, 4, 5]
    assert cl.args[-1].value == 16          # head dim 16 (cfg): one block sums all of a row's dims
    # 2 splits of 40 dims: one block of 64 dims; 32 splits: 16 groups of 16 dims, 3 blocks a row
    assert combine_launch(cfg(split_kv=2, return_lse=True, head_dim_v=40), v, buf).grid == (8, 1, 1)
    many = combine_launch(cfg(split_kv=32, return_lse=True, head_dim_v=40), v, buf)
    assert many.grid == (8, 3, 1) and many.args[-1].value == 16
    # grouped: one block per (batch, kv head, group of 4 of its 2 x 4 rows), per split
    gv = select_variant(c)
    assert gv.path == "grouped" and fwd_launch(c, gv, buf).grid == (2, 4, 1)
    g3 = cfg(g=3, num_heads_q=6, num_heads_kv=2, seq_len_q=3, split_kv=2, return_lse=True)
    assert fwd_launch(g3, select_variant(g3), buf).grid == (3 * 2 * 3, 2, 1)      # 9 rows -> 3 groups
    one = fwd_launch(cfg(), v, {"q": 1, "k": 2, "v": 3, "o": 4})
    assert [a.value for a in one.args][4:8] == [4, None, None, None]
    params, keep = pack_kernel_params(f.args)
    assert len(params) == 39 and len(keep) == 39


def test_nan_patterns():
    import ml_dtypes

    for dt in (np.float16, np.float32, ml_dtypes.bfloat16):
        size, bits = nan_fill_pattern(np.dtype(dt))
        raw = np.array([bits], dtype=np.uint16 if size == 2 else np.uint32)
        assert np.isnan(raw.view(dt).astype(np.float32)).all()


# ---- the kernel source on the host ------------------------------------------------------------
GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ not found: the host emulation needs a C++20 compiler")


class HostEmuBackend(kernels.backends.hostemu.HostEmuBackend):
    """The hostemu backend with the tests' defaults: no disk cache unless one is given, and no
    size limit (every case here is small)."""

    def __init__(self, defects=frozenset(), cache=None, mma=False, source=None):
        super().__init__(frozenset(defects), cache=cache or KernelCache(enabled=False), mma=mma, limits=False,
                         source=source)


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    cache = KernelCache(tmp_path_factory.mktemp("kcache"), enabled=True)
    return HostEmuBackend(cache=cache)


def _emu_run(backend, c):
    from reference.inputs import make_inputs

    inputs = make_inputs(c)
    prepared = backend.prepare(c)
    return inputs, prepared, backend.run(prepared, c, inputs)


def _check_against_reference(c, inputs, out, block_n, tol):
    from reference.exact import attention_exact

    o_ref, lse_ref = attention_exact(c, inputs)
    o = out.out.astype(np.float64)
    assert out.out.shape == o_ref.shape
    assert np.isfinite(o).all()
    scale = max(np.abs(o_ref).max(), 1e-6)
    assert np.abs(o - o_ref).max() / scale < tol, (c, np.abs(o - o_ref).max())
    if c.return_lse:
        lse = out.lse.astype(np.float64)
        assert lse.shape == lse_ref.shape
        assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
        fin = np.isfinite(lse_ref)
        assert np.abs(lse[fin] - lse_ref[fin]).max() < tol * 10
    if c.split_kv > 1:
        from reference.splits import split_partials

        op, lp = split_partials(c, inputs, block_n)
        assert out.o_partials.shape == op.shape and out.lse_partials.shape == lp.shape
        assert np.array_equal(np.isneginf(out.lse_partials), np.isneginf(lp))
        assert not np.isnan(out.o_partials).any() and not np.isnan(out.lse_partials).any()
        assert np.abs(out.o_partials - op).max() < tol * max(np.abs(op).max(), 1e-6)
        empty = np.isneginf(lp)
        assert (out.o_partials[empty] == 0).all()


EMU_CASES = [
    dict(dtype="f32"),
    dict(dtype="f16", causal=True, split_kv=4, return_lse=True),
    dict(dtype="bf16", g=2, current_seq_len=[0, 37], split_kv=3, return_lse=True, trans_k=True, trans_v=True),
    dict(dtype="i8", with_attn_bias=True, trans_q=True, trans_o=True, return_lse=True, head_dim_v=40),
    dict(dtype="f32", g=2, causal=True, prefix_offset=[3, 30], split_kv=2, return_lse=True, num_heads_q=4,
         num_heads_kv=2, with_attn_scale=False),
    dict(dtype="f16", head_dim_qk=300, head_dim_v=5, seq_len_k=70, split_kv=8, return_lse=True),
    dict(dtype="i8", seq_len_q=1, seq_len_k=33, causal=True, prefix_offset=[0], current_seq_len=[32],
         split_kv=2, return_lse=True),
    # grouped-path shapes: 9 rows per kv head (two groups), whole 16-byte vectors, bias, prefixes
    dict(dtype="f16", g=2, seq_len_q=3, num_heads_q=6, num_heads_kv=2, head_dim_qk=64, head_dim_v=64,
         seq_len_k=300, split_kv=5, causal=True, prefix_offset=[10, 200], with_attn_bias=True, return_lse=True),
    dict(dtype="bf16", seq_len_q=1, num_heads_q=8, num_heads_kv=1, head_dim_qk=128, head_dim_v=128,
         seq_len_k=1000, split_kv=16, return_lse=True, current_seq_len=[700]),
    dict(dtype="f32", seq_len_q=2, num_heads_q=4, num_heads_kv=4, head_dim_qk=256, head_dim_v=36,
         seq_len_k=150, split_kv=3, return_lse=True, trans_v=True, trans_o=True),
]


@needs_gxx
@pytest.mark.parametrize("path", ["auto", "rowwise"])
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())[:80])
def test_kernel_source_on_host_matches_reference(emu, case, path):
    c = cfg(**case)
    tol = {"f32": 1e-5, "f16": 4e-3, "bf16": 3e-2, "i8": 4e-3}[c.dtype]
    emu.kernel_path = path
    try:
        inputs, prepared, out = _emu_run(emu, c)
    finally:
        emu.kernel_path = "auto"
    assert prepared.block_n == 32 and prepared.variant == select_variant(c, path=path).name
    _check_against_reference(c, inputs, out, prepared.block_n, tol)
    assert emu.last_alloc.get("o_part", 0) + emu.last_alloc.get("lse_part", 0) == splitkv_extra_bytes(c)


@needs_gxx
def test_kernel_source_defects_show_their_symptoms(tmp_path):
    from reference.exact import attention_exact

    cache = KernelCache(tmp_path, enabled=True)
    c_causal = cfg(dtype="f32", causal=True, seq_len_q=3, seq_len_k=70, split_kv=4, return_lse=True)
    c_small = cfg(dtype="f32", seq_len_q=2, seq_len_k=20, split_kv=4, return_lse=True)
    expect = {
        # the first split of row 0 is valid, the others are fully masked: NaN without the guard
        "no_neginf_guard": (c_causal, "nan"),
        # 1 block, 4 splits: floor gives 0 blocks per split, every split empty, O = 0
        "floor_blocks_per_split": (c_small, "wrong"),
        # 1 block, 4 splits: splits 1..3 empty, acc / 0 = NaN reaches O through the combine
        "no_zero_sum_guard": (c_small, "nan"),
        # row 0 sees no key at all: O = 0, LSE = -inf
        "causal_off_by_one": (c_causal, "wrong"),
    }
    for (defect, (c, symptom)), path in itertools.product(expect.items(), ("grouped", "rowwise")):
        backend = HostEmuBackend({defect}, cache=cache)
        backend.kernel_path = path
        inputs, prepared, out = _emu_run(backend, c)
        assert defect in prepared.variant and ("_grouped_" in prepared.variant) == (path == "grouped")
        o_ref, _ = attention_exact(c, inputs)
        if symptom == "nan":
            assert np.isnan(out.out).any(), defect
        else:
            assert not np.isnan(out.out).any(), defect
            assert np.abs(out.out - o_ref).max() > 0.05, defect


@needs_gxx
def test_a_store_past_o_that_does_not_fault_is_caught_by_the_guard_zone(tmp_path):
    # The kernel source's own oob_store_small, run on the host: its stray store lands in O's
    # guard zone, and the run is a fault naming the buffer, not a silent pass.
    from kernels.backends.base import DeviceFault
    from kernels.guards import GUARD_BYTES

    cache = KernelCache(tmp_path, enabled=True)
    c = cfg(dtype="f16", seq_len_q=2, seq_len_k=70, split_kv=3, return_lse=True)
    clean = HostEmuBackend(cache=cache)
    assert clean.guard_bytes == GUARD_BYTES
    _emu_run(clean, c)   # the correct kernels leave every guard as it was
    backend = HostEmuBackend({"oob_store_small"}, cache=cache)
    with pytest.raises(DeviceFault, match="store outside o: 2 bytes of the guard after it changed, the nearest 2 bytes past its end") as caught:
        _emu_run(backend, c)
    assert not caught.value.poisons
    # The launch plan gives O to the combine kernel alone (the split kernel writes partials).
    assert "attn_splitkv_combine is the one kernel of the call given o" in str(caught.value)
    backend.guard_bytes = 0   # without guards the same store passes unseen
    _inputs, _prepared, out = _emu_run(backend, c)
    assert np.isfinite(out.out).all()


def test_a_device_backend_sizes_the_fused_combines_counters_from_the_plan(monkeypatch):
    from kernels import launch
    from kernels.launch import fuses_combine, fwd_blocks_x
    from kernels.select import select_variant

    backend = HostEmuBackend()
    fused = cfg(seq_len_q=1, num_heads_q=8, num_heads_kv=2, seq_len_k=512, split_kv=4, return_lse=True)
    v = select_variant(fused, mma=True)
    assert fuses_combine(fused, v) and backend.combine_counters(fused, v) == fwd_blocks_x(fused, v) == 2
    many = cfg(seq_len_q=1, num_heads_q=8, num_heads_kv=2, seq_len_k=512, split_kv=64, return_lse=True)
    assert backend.combine_counters(many, select_variant(many, mma=True)) == 0   # the combine kernel (default)
    monkeypatch.setattr(launch, "FUSED_COMBINE_MAX_SPLITS", 1024)
    assert backend.combine_counters(many, select_variant(many, mma=True)) == 2 * (8 + 1)   # 8 groups of 8, and theirs
    # the buffers every caller allocates: zeroed counters, and the groups' O and LSE with two levels
    assert backend.combine_scratch(fused, v) == {"combine_count": (2, np.dtype(np.int32), True)}
    assert backend.combine_scratch(many, select_variant(many, mma=True)) == {
        "combine_count": (18, np.dtype(np.int32), True),
        "combine_part": (8 * 1 * 8 * 1 * (16 + 1), np.dtype(np.float32), False)}   # groups x g x Hq x Sq x (Dv + 1)
    assert backend.combine_counters(fused, select_variant(fused)) == 0           # a portable path
    backend.fuse_combine = False
    assert backend.combine_counters(fused, v) == 0 and backend.combine_scratch(fused, v) == {}


def test_a_combine_defect_defined_in_the_source_runs_the_combine_kernel_not_the_fused_one():
    """A bundle's `#define ATTN_DEFECT_OOB_STORE` is in the combine kernel: the mma decode must
    launch that kernel (as a defect passed as an option does), or the defect never runs."""
    from kernels.select import select_variant
    from kernels.source import KernelSource, local_source

    def with_define(name: str) -> KernelSource:
        files = {local_source().entry_name: local_source().entry_text, **local_source().headers}
        head, sep, rest = files["attention.hip"].partition('#include "hip_compat.h"')
        files["attention.hip"] = f"{head}#define ATTN_DEFECT_{name}\n{sep}{rest}"
        return KernelSource.from_files(files)

    fused = cfg(seq_len_q=1, num_heads_q=8, num_heads_kv=2, seq_len_k=512, split_kv=4, return_lse=True)
    v = select_variant(fused, mma=True)
    assert HostEmuBackend(source=with_define("CAUSAL_OFF_BY_ONE")).combine_counters(fused, v) == 2   # not a combine defect
    for name in ("OOB_STORE", "HANG", "MISSING_BARRIER"):
        backend = HostEmuBackend(source=with_define(name))
        assert backend.combine_counters(fused, v) == 0 and backend.combine_scratch(fused, v) == {}, name


@needs_gxx
def test_outputs_are_nan_prefilled(emu, monkeypatch):
    c = cfg(dtype="f16", split_kv=2, return_lse=True)
    monkeypatch.setattr(HostEmuBackend, "_rt_launch", lambda self, f, launch: None)
    _, _, out = _emu_run(emu, c)
    assert np.isnan(out.out.astype(np.float32)).all() and np.isnan(out.lse).all()
    assert np.isnan(out.o_partials).all() and np.isnan(out.lse_partials).all()


@needs_gxx
def test_compile_error_carries_the_log(tmp_path, monkeypatch):
    backend = HostEmuBackend(cache=KernelCache(tmp_path, enabled=True))
    monkeypatch.setattr(Variant, "macro_options", lambda self: ["-DATTN_MAX_HEAD_DIM=nonsense("])
    with pytest.raises(CompileError) as e:
        backend.prepare(cfg(dtype="f32", head_dim_qk=500))
    assert "error" in e.value.log.lower()
    assert not list(tmp_path.glob("*.bin"))


def test_library_call_resolves_split_kv_zero_for_the_device(tmp_path):
    """kernels.attention: split_kv 0 runs the automatic count sized to the device's SMs; the
    config that ran comes back and its outputs match the reference."""
    from dataclasses import replace

    from kernels import get_backend
    from kernels.attention import attention
    from kernels.autosplit import choose_split_kv

    class EmuWithSMs(HostEmuBackend):
        def device_info(self) -> DeviceInfo:
            return replace(super().device_info(), multiprocessors=2)

    backend = EmuWithSMs(cache=KernelCache(tmp_path, enabled=True))
    raw = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=2000, num_heads_q=2, num_heads_kv=1,
               head_dim_qk=16, head_dim_v=16, split_kv=0)
    ran, out = attention(backend, raw)
    expected = choose_split_kv(AttentionConfig(**{**raw, "split_kv": 1}), 2)
    assert ran.split_kv == expected > 1 and ran.return_lse
    assert out.o_partials.shape[0] == expected
    from reference.inputs import make_inputs

    _check_against_reference(ran, make_inputs(ran), out, 32, 1e-2)
    # an explicit count is kept, and the cpu emulation (no SMs) refuses 0, naming the field
    assert attention(backend, {**raw, "split_kv": 3, "return_lse": True})[0].split_kv == 3
    with pytest.raises(ValueError, match="split_kv"):
        attention(get_backend("cpu"), raw)
