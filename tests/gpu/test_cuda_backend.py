"""The CUDA backend on a real GPU against the host reference: every feature on every kernel path,
random configs, the split edges of decode, and torch's scaled_dot_product_attention as an
oracle nobody here wrote. Defects, faults, guard zones and buffers: test_cuda_faults.py.

`make test-gpu` runs these; they skip cleanly where no CUDA GPU is usable. The helpers below
(CASES, random_configs, check_run, BOUNDS) are shared with tools/evidence/gpu_evidence.py
(through tools/evidence/gpu_suite.py) and test_cuda_faults.py.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from attnconfig import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes
from kernels.backends.base import BackendUnavailable
from kernels.select import mma_applies

pytestmark = pytest.mark.gpu

# Correctness bounds of this test (not the sweep's calibrated gates): row_err of O and of the
# valid partials, and max |LSE - ref|, against the float64 exact reference.
BOUNDS = {
    "f32": {"row": 1e-4, "lse": 1e-4},
    "f16": {"row": 1e-2, "lse": 1e-3},
    "bf16": {"row": 4e-2, "lse": 1e-3},
    "i8": {"row": 1e-2, "lse": 6e-2, "abs": 4e-3},    # O and LSE are f16
}
# i8 rounds P to f16 before P.V (docs/spec.md §1) and the float64 reference does not: where a row's
# output cancels to almost 0 (seen with head_dim_v = 1), row_err measures that rounding
# relative to a tiny value. There an i8 row also passes when its absolute error is within
# "abs" (2^-12 relative P rounding times |V| <= ~5, plus margin). GPU run of 2026-12-03: the
# kernel equals a numpy emulation with f16-rounded P exactly on such a row.


def cfg(**kw: Any) -> AttentionConfig:
    base = dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=100, num_heads_q=2, num_heads_kv=1,
                head_dim_qk=64, head_dim_v=64)
    base.update(kw)
    return AttentionConfig(**base)


# One config per feature (and the corners the split arithmetic has), over all four dtypes.
_FEATURES: list[dict[str, Any]] = [
    {},
    dict(head_dim_qk=1, head_dim_v=1),
    dict(head_dim_qk=7, head_dim_v=33),
    dict(head_dim_qk=80, head_dim_v=96),
    dict(head_dim_qk=192, head_dim_v=256),
    dict(head_dim_qk=300, head_dim_v=513, seq_len_k=40),
    dict(head_dim_qk=1024, head_dim_v=1024, seq_len_k=33, seq_len_q=2),
    dict(num_heads_q=8, num_heads_kv=2),
    dict(num_heads_q=32, num_heads_kv=1, seq_len_q=1, seq_len_k=500),
    dict(causal=True),
    dict(causal=True, seq_len_q=64, seq_len_k=64, split_kv=4, return_lse=True),
    dict(g=3, causal=True, prefix_offset=[0, 17, 99], split_kv=3, return_lse=True),
    dict(g=3, seq_len_q=1, current_seq_len=[0, 31, 99], split_kv=2, return_lse=True),
    dict(g=2, seq_len_q=1, causal=True, current_seq_len=[40, 99], prefix_offset=[40, 99], split_kv=8, return_lse=True),
    dict(with_attn_bias=True),
    dict(with_attn_bias=True, causal=True, split_kv=5, return_lse=True),
    dict(with_attn_scale=False, head_dim_qk=16),
    dict(with_attn_scale=False, head_dim_qk=128, head_dim_v=32),   # saturated softmax
    dict(trans_q=True),
    dict(trans_k=True, trans_v=True),
    dict(trans_o=True, split_kv=2, return_lse=True),
    dict(trans_q=True, trans_k=True, trans_v=True, trans_o=True, causal=True, return_lse=True),
    dict(return_lse=True),
    dict(split_kv=2, return_lse=True, seq_len_k=1),                # L_b = 0: split 1 empty
    dict(split_kv=5, return_lse=True, seq_len_k=12 * 32),          # 12 blocks, S = 5: split 4 empty
    dict(split_kv=128, return_lse=True, seq_len_k=1000),
    dict(split_kv=16, return_lse=True, seq_len_k=4096, seq_len_q=1, num_heads_q=8, num_heads_kv=8),
    dict(split_kv=64, return_lse=True, seq_len_k=2050, g=2, current_seq_len=[5, 2049], seq_len_q=2),
]
CASES: list[AttentionConfig] = [
    cfg(dtype=dt, data_seed=i, **f) for i, f in enumerate(_FEATURES) for dt in ("f16", "bf16", "f32", "i8")
]


def random_configs(n: int, seed: int = 0, max_cost: float = 3e8) -> list[AttentionConfig]:
    """Configs drawn like the sampler (docs/spec.md §6) but small enough for a quick float64 reference."""
    rng = np.random.default_rng(seed)
    out: list[AttentionConfig] = []
    common = (32, 64, 80, 96, 128, 192, 256)

    def logu(lo: int, hi: int) -> int:
        return int(min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))))

    while len(out) < n:
        sk = logu(1, 8192)
        g = logu(1, 4)
        kv_cache = rng.random() < 0.5
        sq = 1 if kv_cache else logu(1, 512)
        r = rng.random()
        if r < 0.25:
            hq = hkv = 1
        elif r < 0.5:
            hq = hkv = 2 ** int(rng.integers(1, 4))
        else:
            hkv = 2 ** int(rng.integers(0, 3))
            hq = hkv * 2 ** int(rng.integers(1, 4))
        ret = bool(rng.random() < 0.5)
        split = int(2 ** rng.integers(0, 8)) if ret else 1
        dims = [int(rng.choice(common)) if rng.random() < 0.5 else logu(1, 1024) for _ in range(2)]
        causal = bool(rng.random() < 0.5)
        cur = [int(x) for x in rng.integers(0, sk, size=g)] if kv_cache else None
        prefix = None
        if causal and rng.random() < 0.5:
            prefix = list(cur) if kv_cache else [int(x) for x in rng.integers(0, sk, size=g)]
        c = AttentionConfig(
            dtype=str(rng.choice(["f16", "bf16", "f32", "i8"])), g=g, seq_len_q=sq, seq_len_k=sk,
            num_heads_q=hq, num_heads_kv=hkv, head_dim_qk=dims[0], head_dim_v=dims[1],
            with_attn_scale=bool(rng.random() < 0.5), with_attn_bias=bool(rng.random() < 0.5),
            causal=causal, prefix_offset=prefix, current_seq_len=cur,
            trans_q=bool(rng.random() < 0.5), trans_k=bool(rng.random() < 0.5),
            trans_v=bool(rng.random() < 0.5), trans_o=bool(rng.random() < 0.5),
            return_lse=ret, split_kv=split, data_seed=int(rng.integers(0, 2**31)))
        if g * hq * sq * sk * (c.head_dim_qk + c.head_dim_v + 8) > max_cost:
            continue
        out.append(c)
    return out


def check_run(c: AttentionConfig, inputs: Any, res: Any, block_n: int) -> tuple[list[str], dict[str, Any]]:
    """Compare one RunOutput with the reference; returns (failures, metrics)."""
    from reference import attention_exact, attention_splitkv, verify_outputs

    ref = attention_splitkv(c, inputs, block_n)
    exact = attention_exact(c, inputs)
    m = verify_outputs(c, ref, None, res.out, res.lse, res.o_partials, res.lse_partials, exact=exact)
    b = BOUNDS[c.dtype]
    fails = []
    if m["out_nonfinite"]:
        fails.append(f"out_nonfinite={m['out_nonfinite']}")
    if not m["out_row_err"] <= b["row"] and not (m["out_max_abs"] or 0.0) <= b.get("abs", -1.0):
        fails.append(f"out_row_err={m['out_row_err']:.3g} out_max_abs={m['out_max_abs']:.3g}")
    if c.return_lse:
        if m["lse_nonfinite"] or m["lse_inf_mismatch"]:
            fails.append(f"lse_nonfinite={m['lse_nonfinite']} lse_inf_mismatch={m['lse_inf_mismatch']}")
        if not (m["lse_max_abs"] or 0.0) <= b["lse"]:
            fails.append(f"lse_max_abs={m['lse_max_abs']:.3g}")
    if c.split_kv > 1:
        if res.o_partials is None or res.lse_partials is None:
            fails.append("partials missing")
        else:
            if m["partials_nonfinite"] or m["partials_invalid_bad"]:
                fails.append(f"partials_nonfinite={m['partials_nonfinite']} invalid_bad={m['partials_invalid_bad']}")
            if not m["partials_row_err"] <= b["row"] and not _partials_max_abs(res, ref) <= b.get("abs", -1.0):
                fails.append(f"partials_row_err={m['partials_row_err']:.3g}")
            if not (m["partials_lse_max_abs"] or 0.0) <= b["lse"] * 10:
                fails.append(f"partials_lse_max_abs={m['partials_lse_max_abs']:.3g}")
    elif res.o_partials is not None:
        fails.append("partials returned with split_kv=1")
    return fails, m


def _partials_max_abs(res: Any, ref: Any) -> float:
    fin = np.isfinite(ref.o_partials) & np.isfinite(res.o_partials)
    if not fin.any():
        return 0.0
    return float(np.abs(res.o_partials[fin].astype(np.float64) - ref.o_partials[fin]).max())


# ---- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_backend():
    from kernels.cache import KernelCache

    try:
        from kernels.backends.cuda import CudaBackend

        backend = CudaBackend(cache=KernelCache())   # $ATTNSWEEP_KERNEL_CACHE or ~/.cache/attnsweep/kernels
    except BackendUnavailable as exc:
        pytest.skip(f"no usable CUDA GPU: {exc}")
    yield backend
    backend.close()


def _run(backend, c):
    from reference import make_inputs

    inputs = make_inputs(c)
    prepared = backend.prepare(c)
    return inputs, prepared, backend.run(prepared, c, inputs)


def _path_of(variant: str) -> str:
    return "mma" if "_mma" in variant else "grouped" if "_grouped" in variant else "rowwise"


def _run_on(backend, c, path):
    """_run with the kernel path forced to `path` for this config; checks it ran there."""
    backend.kernel_path = path
    try:
        inputs, prepared, res = _run(backend, c)
    finally:
        backend.kernel_path = "auto"
    assert _path_of(prepared.variant) == path, (prepared.variant, path)
    return inputs, prepared, res


def _failing_on(backend, configs, path):
    """(config, failures) of each of `configs` that fails check_run on the forced `path`."""
    bad = []
    for c in configs:
        inputs, prepared, res = _run_on(backend, c, path)
        fails, _ = check_run(c, inputs, res, prepared.block_n)
        if fails:
            bad.append((c.to_json(), fails))
    return bad


# ---- tests ----------------------------------------------------------------------------------
def test_device_info(cuda_backend):
    info = cuda_backend.device_info()
    assert info.backend == "cuda" and info.device and info.total_memory > 0
    assert info.arch.startswith("sm_") and info.compiler_version.startswith("nvrtc ")
    assert info.driver_version
    assert info.multiprocessors and info.multiprocessors > 0


def test_verify_with_automatic_split_runs_the_count_chosen_for_this_gpu(cuda_backend):
    import json
    import subprocess
    import sys

    from kernels.autosplit import choose_split_kv

    raw = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=8192, num_heads_q=8, num_heads_kv=1,
               head_dim_qk=128, head_dim_v=128, split_kv=0)
    proc = subprocess.run([sys.executable, "-m", "cli", "verify", "--backend", "cuda", "--config", json.dumps(raw),
                           "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = choose_split_kv(AttentionConfig(**{**raw, "split_kv": 1}), cuda_backend.device_info().multiprocessors,
                               mma=cuda_backend.mma_capable)
    assert out["outcome"] == "pass" and out["split_kv"] == expected > 1


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"{c.dtype}-{c.content_hash()[:8]}")
def test_feature_matrix_matches_reference(cuda_backend, c):
    inputs, prepared, res = _run(cuda_backend, c)
    fails, metrics = check_run(c, inputs, res, prepared.block_n)
    assert not fails, (c.to_json(), fails)
    assert res.run_s > 0
    assert cuda_backend.last_alloc.get("o_part", 0) + cuda_backend.last_alloc.get("lse_part", 0) == splitkv_extra_bytes(c)


GROUPED_CASES = [c for c in CASES if c.dtype != "i8" and max(c.head_dim_qk, c.head_dim_v) <= 256]


@pytest.mark.parametrize("c", GROUPED_CASES, ids=lambda c: f"{c.dtype}-{c.content_hash()[:8]}")
def test_feature_matrix_on_the_rowwise_path_too(cuda_backend, c):
    """The configs the grouped path takes by default, forced onto the portable rowwise path."""
    assert not _failing_on(cuda_backend, [c], "rowwise")


def test_feature_matrix_on_the_grouped_path_too(cuda_backend):
    """The configs the mma path takes by default, forced onto the portable grouped path."""
    if not cuda_backend.mma_capable:
        pytest.skip("this GPU has no mma path: the feature matrix already ran the grouped path")
    assert not _failing_on(cuda_backend, [c for c in GROUPED_CASES if mma_applies(c)], "grouped")


def as_mma(c: AttentionConfig) -> AttentionConfig:
    """`c` made eligible for the mma path: f16/bf16, head dims rounded up to multiples of 8 (at
    most 256), Q, K and V untransposed."""
    raw = c.model_dump()
    raw.update(dtype=c.dtype if c.dtype in ("f16", "bf16") else ("bf16" if c.data_seed % 2 else "f16"),
               head_dim_qk=min(256, -(-c.head_dim_qk // 8) * 8), head_dim_v=min(256, -(-c.head_dim_v // 8) * 8),
               trans_q=False, trans_k=False, trans_v=False)
    return AttentionConfig(**raw)


# The mma path's own corners: decode rows packed across GQA heads (1 to 16 rows of a kv head),
# prefill row tiles that straddle two heads, causal tiles skipped, the 32-key tiles of big head
# dims, bucket padding (dims 40, 80, 192), ragged caches and split boundaries off the tile.
MMA_CASES = [as_mma(c) for c in CASES] + [
    cfg(dtype="f16", g=2, num_heads_q=32, num_heads_kv=8, seq_len_q=1, seq_len_k=5000, head_dim_qk=128,
        head_dim_v=128, split_kv=8, return_lse=True, current_seq_len=[4999, 1234]),
    cfg(dtype="bf16", g=1, num_heads_q=16, num_heads_kv=1, seq_len_q=1, seq_len_k=3000, head_dim_qk=128,
        head_dim_v=128, split_kv=32, return_lse=True, causal=True, prefix_offset=[2999]),
    cfg(dtype="f16", g=1, num_heads_q=8, num_heads_kv=2, seq_len_q=4, seq_len_k=777, head_dim_qk=256,
        head_dim_v=256, split_kv=3, return_lse=True, with_attn_bias=True),
    cfg(dtype="bf16", g=2, num_heads_q=6, num_heads_kv=2, seq_len_q=37, seq_len_k=300, head_dim_qk=40,
        head_dim_v=80, causal=True, prefix_offset=[0, 250], split_kv=2, return_lse=True),
    cfg(dtype="f16", g=1, num_heads_q=4, num_heads_kv=4, seq_len_q=300, seq_len_k=300, head_dim_qk=192,
        head_dim_v=64, causal=True, with_attn_bias=True),
    cfg(dtype="bf16", g=1, num_heads_q=2, num_heads_kv=2, seq_len_q=130, seq_len_k=2000, head_dim_qk=256,
        head_dim_v=256, causal=True, prefix_offset=[1800], split_kv=4, return_lse=True),
    cfg(dtype="f16", g=3, num_heads_q=1, num_heads_kv=1, seq_len_q=1, seq_len_k=100, head_dim_qk=64,
        head_dim_v=64, current_seq_len=[0, 31, 99], split_kv=16, return_lse=True, trans_o=True),
    cfg(dtype="f16", g=1, num_heads_q=16, num_heads_kv=16, seq_len_q=64, seq_len_k=64, head_dim_qk=32,
        head_dim_v=32, with_attn_scale=False),
]


@pytest.mark.parametrize("c", MMA_CASES, ids=lambda c: f"{c.dtype}-{c.content_hash()[:8]}")
def test_mma_path_matches_reference(cuda_backend, c):
    if not cuda_backend.mma_capable:
        pytest.skip("this GPU has no mma path")
    assert not _failing_on(cuda_backend, [c], "mma")


def test_random_configs_on_the_mma_path(cuda_backend):
    if not cuda_backend.mma_capable:
        pytest.skip("this GPU has no mma path")
    bad = _failing_on(cuda_backend, [as_mma(c) for c in random_configs(120, seed=11)], "mma")
    assert not bad, bad[:5]


# Decode configs whose splits hold 0, 1, 2, 3 and many key tiles, ragged and causal-prefix
# caches: the split kernel's tile loop and the combine (fused for few splits) at their edges.
DECODE_SPLIT_CASES = [
    cfg(dtype="f16", g=2, num_heads_q=32, num_heads_kv=8, seq_len_q=1, seq_len_k=2000, head_dim_qk=128,
        head_dim_v=128, split_kv=s, return_lse=s > 1, current_seq_len=[1999, 150]) for s in (1, 3, 8, 16, 40)
] + [
    cfg(dtype="bf16", g=1, num_heads_q=8, num_heads_kv=1, seq_len_q=1, seq_len_k=4100, head_dim_qk=64,
        head_dim_v=64, split_kv=7, return_lse=True, causal=True, prefix_offset=[3000]),
    cfg(dtype="f16", g=1, num_heads_q=4, num_heads_kv=2, seq_len_q=1, seq_len_k=1000, head_dim_qk=256,
        head_dim_v=256, split_kv=2, return_lse=True, with_attn_bias=True),
    cfg(dtype="bf16", g=3, num_heads_q=16, num_heads_kv=1, seq_len_q=1, seq_len_k=600, head_dim_qk=96,
        head_dim_v=160, split_kv=5, return_lse=True, current_seq_len=[0, 599, 64], trans_o=True),
    # Hundreds of splits (the combine kernel; with FUSED_COMBINE_MAX_SPLITS = 1024 the fused
    # combine's two levels): a single kv head cut short (most splits empty, whole groups of them),
    # heads of their own (one row per tile), D = 256.
    cfg(dtype="f16", g=1, num_heads_q=8, num_heads_kv=1, seq_len_q=1, seq_len_k=20000, head_dim_qk=128,
        head_dim_v=128, split_kv=256, return_lse=True, current_seq_len=[7001]),
    cfg(dtype="bf16", g=2, num_heads_q=4, num_heads_kv=4, seq_len_q=1, seq_len_k=3000, head_dim_qk=64,
        head_dim_v=64, split_kv=400, return_lse=True),
    cfg(dtype="bf16", g=1, num_heads_q=16, num_heads_kv=2, seq_len_q=1, seq_len_k=9000, head_dim_qk=256,
        head_dim_v=256, split_kv=100, return_lse=True, causal=True, prefix_offset=[8000]),
]


@pytest.mark.parametrize("c", DECODE_SPLIT_CASES, ids=lambda c: f"{c.dtype}-s{c.split_kv}-{c.content_hash()[:8]}")
def test_decode_split_edges_match_reference(cuda_backend, c):
    assert not _failing_on(cuda_backend, [c], "mma" if cuda_backend.mma_capable else "grouped")


def test_mma_decode_fuses_the_combine_and_matches_either_way(cuda_backend):
    from kernels.launch import fuses_combine

    if not cuda_backend.mma_capable:
        pytest.skip("this GPU has no mma path")
    split = [c for c in DECODE_SPLIT_CASES + MMA_CASES if c.split_kv > 1]
    fused = [c for c in split if fuses_combine(c, cuda_backend.variant_for(c))]
    assert len(fused) >= 5
    assert not _failing_on(cuda_backend, fused, "mma")      # run() also checks the counters re-armed
    cuda_backend.fuse_combine = False
    try:
        assert not _failing_on(cuda_backend, fused, "mma")
    finally:
        cuda_backend.fuse_combine = True


def test_mma_decode_variants_reach_their_blocks_per_sm(cuda_backend):
    from kernels.tuning import MMA_DECODE_SHAPES

    if not cuda_backend.mma_capable:
        pytest.skip("this GPU has no mma path")
    for dsum, *_ in MMA_DECODE_SHAPES:
        c = cfg(dtype="f16", g=1, num_heads_q=8, num_heads_kv=1, seq_len_q=1, seq_len_k=256,
                head_dim_qk=dsum // 2, head_dim_v=dsum // 2)
        prepared = cuda_backend.prepare(c)
        v = prepared.handle.variant
        assert v.path == "mma" and v.block_m == 16 and v.key_groups > 1
        # the automatic split counts v.min_blocks resident blocks per SM: the driver must agree
        assert cuda_backend.resident_blocks(prepared) >= v.min_blocks, v.name


def test_random_configs_match_reference(cuda_backend):
    bad = []
    for c in random_configs(60, seed=1):
        inputs, prepared, res = _run(cuda_backend, c)
        fails, _ = check_run(c, inputs, res, prepared.block_n)
        if fails:
            bad.append((c.to_json(), fails))
    assert not bad


# ---- torch SDPA as an independent oracle ----------------------------------------------------
def _to_torch(x: np.ndarray, device: str):
    import ml_dtypes
    import torch

    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.array(x)).to(device)  # a writable copy: make_inputs hands out read-only arrays


def sdpa_reference(c: AttentionConfig, inputs: dict) -> np.ndarray:
    """torch.nn.functional.scaled_dot_product_attention of a float config, as float32 numpy."""
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    q, k, v = (_to_torch(inputs[n], dev) for n in ("q", "k", "v"))
    sk, sq = c.seq_len_k, c.seq_len_q
    j = torch.arange(sk, device=dev)
    mask = torch.zeros((c.g, 1, sq, sk), dtype=torch.bool, device=dev)
    for b in range(c.g):
        hidden = torch.zeros((sq, sk), dtype=torch.bool, device=dev)
        if c.current_seq_len is not None:
            hidden |= j[None, :] > c.current_seq_len[b]
        if c.causal:
            pre = c.prefix_offset[b] if c.prefix_offset is not None else 0
            hidden |= j[None, :] > (torch.arange(sq, device=dev)[:, None] + pre)
        mask[b, 0] = hidden
    attn_mask = torch.zeros(mask.shape, dtype=q.dtype, device=dev).masked_fill(mask, float("-inf"))
    if c.with_attn_bias:
        attn_mask = attn_mask + _to_torch(inputs["bias"], dev)
    scale = 1.0 / math.sqrt(c.head_dim_qk) if c.with_attn_scale else 1.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale,
                                         enable_gqa=c.num_heads_q != c.num_heads_kv)
    return out.float().cpu().numpy()


SDPA_CASES = [
    cfg(dtype="f16", g=2, num_heads_q=8, num_heads_kv=2, seq_len_q=1, seq_len_k=3000, head_dim_qk=128,
        head_dim_v=128, split_kv=8, return_lse=True, current_seq_len=[1000, 2999]),
    cfg(dtype="bf16", g=1, num_heads_q=4, num_heads_kv=4, seq_len_q=200, seq_len_k=300, head_dim_qk=64,
        head_dim_v=64, causal=True, prefix_offset=[100], split_kv=4, return_lse=True, trans_k=True),
    cfg(dtype="f32", g=2, num_heads_q=4, num_heads_kv=1, seq_len_q=17, seq_len_k=129, head_dim_qk=80,
        head_dim_v=80, with_attn_bias=True, trans_v=True, trans_o=True),
    cfg(dtype="f16", g=1, num_heads_q=2, num_heads_kv=1, seq_len_q=64, seq_len_k=64, head_dim_qk=256,
        head_dim_v=256, causal=True, with_attn_scale=False),
]


# Decode and prefill shapes of the grouped path (the kernels' fast path) beside the corner cases above.
SDPA_EXTRA_CASES = [
    cfg(dtype="f16", g=2, num_heads_q=32, num_heads_kv=8, seq_len_q=1, seq_len_k=4096, head_dim_qk=128,
        head_dim_v=128, split_kv=8, return_lse=True),
    cfg(dtype="bf16", g=1, num_heads_q=8, num_heads_kv=1, seq_len_q=1, seq_len_k=8192, head_dim_qk=128,
        head_dim_v=128, split_kv=64, return_lse=True),
    cfg(dtype="bf16", g=2, num_heads_q=16, num_heads_kv=4, seq_len_q=4, seq_len_k=2048, head_dim_qk=256,
        head_dim_v=256, split_kv=4, return_lse=True, current_seq_len=[700, 2047]),
    cfg(dtype="f16", g=1, num_heads_q=4, num_heads_kv=4, seq_len_q=512, seq_len_k=512, head_dim_qk=64,
        head_dim_v=64, causal=True),
]


@pytest.mark.parametrize("c", SDPA_CASES + SDPA_EXTRA_CASES, ids=lambda c: f"{c.dtype}-{c.content_hash()[:8]}")
def test_matches_torch_sdpa(cuda_backend, c):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    from reference import make_inputs

    inputs = make_inputs(c)
    ours = cuda_backend.run(cuda_backend.prepare(c), c, inputs).out.astype(np.float32)
    theirs = sdpa_reference(c, inputs)
    tol = {"f32": 1e-3, "f16": 1e-2, "bf16": 5e-2}[c.dtype]   # torch's kernels round P
    err = np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-6)
    assert err < tol, err
