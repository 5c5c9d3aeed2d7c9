"""The mma decode kernel's fused combine (attention.hip attn_fused_combine), run by the host
emulation: the very device code, with its counters, its groups and their partials, against the
reference's unmasked combine (docs/spec.md §3).

The emulation runs blocks one after another, so it cannot show a race; what it shows is that
whichever block finishes last (the harness hands the blocks their splits in a shuffled order)
combines every split exactly once and re-arms every counter."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernels.launch import fused_combine_group
from reference.splits import combine_unmasked

from .test_variants import GXX, SRC_DIR, needs_gxx

BM, NT = 16, 64
HARNESS = r'''
#include "attention.hip"
// One row tile per blockIdx.x (a kv head's rows_per_kv <= 16 rows), its splits in blockIdx.y,
// which the harness renames through `order`: the blocks finish in that order. Each block first
// writes its split's partials from src (as the split kernel does), so that a combine run before
// every split it reads has written reads the NaN the buffers start with.
template <int C>
__global__ void fused_combine_harness(const float* src_o, const float* src_lse, float* o_part, float* lse_part,
                                      float* o, float* lse, int* count, float* group_part, const int* order,
                                      int ratio, int hq, int dv, int num_splits, int group) {
    alignas(16) __shared__ unsigned char smem[64 * 1024];
    blockIdx.y = (unsigned)order[blockIdx.x * num_splits + blockIdx.y];
    const long long rows = hq;
    for (int i = (int)threadIdx.x; i < ratio * dv; i += %(NT)d) {
        const long long at = ((long long)blockIdx.y * rows + blockIdx.x * ratio + i / dv) * dv + i %% dv;
        o_part[at] = src_o[at];
    }
    if ((int)threadIdx.x < ratio) {
        const long long at = (long long)blockIdx.y * rows + blockIdx.x * ratio + threadIdx.x;
        lse_part[at] = src_lse[at];
    }
    __syncthreads();
    attn_fused_combine<float, %(BM)d, %(NT)d, C>(smem, o_part, lse_part, o, lse, count, group_part, 0, ratio,
                                            (int)blockIdx.x * ratio, 0, hq, 1, dv, rows,
                                            (long long)hq * dv, dv, dv, 1, num_splits, group);
}
// chunk: the partials a thread reads per round trip (the kernel takes 4 or 16 by head dim)
extern "C" void run(const float* so, const float* sl, float* op, float* lp, float* o, float* lse, int* count,
                    float* gp, const int* order, int ratio, int hq, int dv, int num_splits, int group,
                    unsigned tiles, int chunk) {
    void* p[] = {&so, &sl, &op, &lp, &o, &lse, &count, &gp, &order, &ratio, &hq, &dv, &num_splits, &group};
    if (chunk == 4) attn_emu_launch(&fused_combine_harness<4>, p, tiles, (unsigned)num_splits, 1, %(NT)d);
    else attn_emu_launch(&fused_combine_harness<16>, p, tiles, (unsigned)num_splits, 1, %(NT)d);
}
''' % {"BM": BM, "NT": NT}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if GXX is None:
        pytest.skip("g++ not found")
    d = tmp_path_factory.mktemp("fused-combine")
    src, lib = d / "harness.cpp", d / "harness.so"
    src.write_text(HARNESS)
    proc = subprocess.run([GXX, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-DATTN_HOST_EMULATION",
                           "-I", str(SRC_DIR), str(src), "-o", str(lib)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return ctypes.CDLL(str(lib))


def fused(harness, o_part, lse_part, hkv, *, group=None, order=None, count=None, rng=None, chunk=4):
    """O [hq, dv] and LSE [hq] as the kernel's fused combine writes them, and its counters after.
    Asserts that the splits' partials are left as the blocks wrote them (the verifier reads them)."""
    s, hq, dv = o_part.shape
    group = group or fused_combine_group(s)
    groups = -(-s // group)
    if count is None:
        count = np.zeros(hkv * (groups + 1 if groups > 1 else 1), dtype=np.int32)
    if order is None:
        order = np.stack([(rng or np.random.default_rng(0)).permutation(s) for _ in range(hkv)])
    so, sl = np.ascontiguousarray(o_part, np.float32), np.ascontiguousarray(lse_part, np.float32)
    op, lp = np.full_like(so, np.nan), np.full_like(sl, np.nan)
    o, lse = np.full((hq, dv), np.nan, np.float32), np.full(hq, np.nan, np.float32)
    gp = np.full(groups * hq * (dv + 1) if groups > 1 else 1, np.nan, np.float32)
    order = np.ascontiguousarray(order, np.int32)
    f = ctypes.c_void_p
    harness.run(f(so.ctypes.data), f(sl.ctypes.data), f(op.ctypes.data), f(lp.ctypes.data), f(o.ctypes.data), f(lse.ctypes.data), f(count.ctypes.data),
                f(gp.ctypes.data), f(order.ctypes.data), ctypes.c_int(hq // hkv), ctypes.c_int(hq), ctypes.c_int(dv),
                ctypes.c_int(s), ctypes.c_int(group), ctypes.c_uint(hkv), ctypes.c_int(chunk))
    assert op.tobytes() == so.tobytes() and lp.tobytes() == sl.tobytes()
    return o, lse, count


def partials(rng, s, hq, dv, empty=0.0):
    o = rng.standard_normal((s, hq, dv)).astype(np.float32)
    lse = (rng.standard_normal((s, hq)) * 4).astype(np.float32)
    lse[rng.random((s, hq)) < empty] = -np.inf
    return o, lse


@needs_gxx
@pytest.mark.parametrize("chunk", [4, 16])
@pytest.mark.parametrize("s", [2, 8, 9, 37, 128, 400])
def test_fused_combine_equals_the_unmasked_combine_at_any_split_count(harness, s, chunk):
    rng = np.random.default_rng(s)
    o_part, lse_part = partials(rng, s, hq=8, dv=16, empty=0.3)
    o, lse, count = fused(harness, o_part, lse_part, hkv=2, rng=rng, chunk=chunk)
    want_o, want_lse = combine_unmasked(o_part, lse_part)
    np.testing.assert_allclose(o, want_o, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-6, atol=2e-6)
    assert not count.any()   # every counter re-armed for the next launch


@needs_gxx
def test_fused_combine_is_the_same_whichever_block_finishes_last(harness):
    rng = np.random.default_rng(1)
    o_part, lse_part = partials(rng, 128, hq=4, dv=8, empty=0.2)
    runs = [fused(harness, o_part, lse_part, hkv=1, order=order[None])[:2]
            for order in (np.arange(128), np.arange(128)[::-1], rng.permutation(128))]
    for o, lse in runs[1:]:   # the combine's arithmetic does not depend on the order, only who does it
        np.testing.assert_array_equal(o, runs[0][0])
        np.testing.assert_array_equal(lse, runs[0][1])


@needs_gxx
def test_fused_combine_counters_left_armed_stay_visible(harness):
    """A launch that starts with a counter already counted (a previous launch that did not
    finish) cannot re-arm it: the host's check of the counters after each call sees that."""
    rng = np.random.default_rng(2)
    o_part, lse_part = partials(rng, 64, hq=4, dv=8)
    count = np.zeros(1 * (8 + 1), dtype=np.int32)
    count[3] = 1   # group 3 already counted one block: its last block is never the 8th
    _, _, count = fused(harness, o_part, lse_part, hkv=1, count=count, rng=rng)
    assert count.any()


@needs_gxx
def test_fused_combine_empty_groups_and_rows(harness):
    """A row with every split empty gets O = 0 and LSE = -inf; a row whose splits are empty in
    whole first-level groups gets the combine of the others; a NaN LSE_s shows in its row."""
    rng = np.random.default_rng(3)
    s = 100
    o_part, lse_part = partials(rng, s, hq=4, dv=8)
    group = fused_combine_group(s)
    lse_part[:, 0] = -np.inf                          # row 0: nothing
    lse_part[: 3 * group, 1] = -np.inf                # row 1: its first three groups empty
    lse_part[s - 1, 2] = np.nan                       # row 2: one NaN partial
    o, lse, _ = fused(harness, o_part, lse_part, hkv=1, rng=rng)
    assert (o[0] == 0).all() and lse[0] == -np.inf
    want_o, want_lse = combine_unmasked(o_part[3 * group:, 1:2], lse_part[3 * group:, 1:2])
    np.testing.assert_allclose(o[1:2], want_o, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(lse[1:2], want_lse, rtol=2e-6)
    assert np.isnan(o[2]).all()
    np.testing.assert_allclose(o[3], combine_unmasked(o_part[:, 3:4], lse_part[:, 3:4])[0][0], rtol=2e-5, atol=2e-6)


def test_fused_combine_groups_are_about_the_square_root():
    assert [fused_combine_group(s) for s in (2, 8)] == [2, 8]          # one level
    for s in (9, 64, 128, 400, 1024):
        g = fused_combine_group(s)
        groups = -(-s // g)
        assert g * g >= s and (g - 1) * (g - 1) < s and groups <= g   # both levels read at most ~sqrt(s)
