"""The CUDA backend on a real GPU when something is wrong: every defect caught on every kernel
path, a sticky fault kept to its config's process, guard zones around every buffer,
NaN-prefilled outputs, partial buffers of the size the prefilter counts, and the disk cache.

`make test-gpu` runs these; they skip cleanly where no CUDA GPU is usable. The cases and checks
are test_cuda_backend.py's.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnconfig import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes
from kernels.backends.base import NUMERIC_DEFECTS, BackendUnavailable
from tests.gpu.test_cuda_backend import _run, as_mma, cfg, check_run, cuda_backend, random_configs  # noqa: F401 - a fixture

pytestmark = pytest.mark.gpu

# Each defect with a config that shows it, and how.
DEFECT_CASES = {
    "no_neginf_guard": cfg(dtype="f16", causal=True, seq_len_q=4, seq_len_k=200, split_kv=4, return_lse=True),
    "floor_blocks_per_split": cfg(dtype="bf16", seq_len_q=2, seq_len_k=20, split_kv=4, return_lse=True),
    "no_zero_sum_guard": cfg(dtype="f32", seq_len_q=1, seq_len_k=40, current_seq_len=[3], split_kv=8, return_lse=True),
    "causal_off_by_one": cfg(dtype="f16", causal=True, seq_len_q=5, seq_len_k=50),
    # |LSE| in the hundreds: exp(LSE_s) leaves float32's range.
    "combine_no_max_shift": cfg(dtype="f16", seq_len_q=2, seq_len_k=300, split_kv=4, return_lse=True,
                                data_regime="large_logits"),
}


@pytest.mark.parametrize("path", ["auto", "rowwise", "grouped", "mma"])
@pytest.mark.parametrize("defect", sorted(NUMERIC_DEFECTS))
def test_each_defect_is_caught(defect, path):
    from kernels.cache import KernelCache

    try:
        from kernels.backends.cuda import CudaBackend

        backend = CudaBackend(frozenset({defect}), cache=KernelCache())
    except BackendUnavailable as exc:
        pytest.skip(f"no usable CUDA GPU: {exc}")
    backend.kernel_path = path
    c = DEFECT_CASES[defect]
    if path == "mma":
        if not backend.mma_capable:
            pytest.skip("this GPU has no mma path")
        c = as_mma(c)
    inputs, prepared, res = _run(backend, c)
    if path in ("grouped", "mma"):
        assert f"_{path}_defect-" in prepared.variant
    assert defect in prepared.variant
    fails, _ = check_run(c, inputs, res, prepared.block_n)
    assert fails, f"{defect} not caught on {c.to_json()}"
    # the same config passes without the defect
    clean = CudaBackend(cache=KernelCache())
    clean.kernel_path = path
    inputs, prepared, res = _run(clean, c)
    assert not check_run(c, inputs, res, prepared.block_n)[0]


FAULT_CASE = cfg(dtype="f16", seq_len_q=3, seq_len_k=300, split_kv=4, return_lse=True)


def _verify(config: AttentionConfig, *defects: str, timeout: float = 120, **env: str) -> dict:
    """`attnsweep verify` in a process of its own: a sticky fault must not poison this one's context."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    argv = [sys.executable, "-m", "cli", "verify", "--json", "--backend", "cuda", "--config", config.to_json()]
    for d in defects:
        argv += ["--defect", d]
    proc = subprocess.run(argv, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("mma", [False, True])
def test_an_illegal_store_is_a_fault_of_its_config_and_the_next_process_runs_clean(cuda_backend, mma):
    # as_mma: a decode shape whose mma kernel fuses the combine, except with a combine defect.
    c = as_mma(FAULT_CASE) if mma else FAULT_CASE
    got = _verify(c, "oob_store")
    assert got["outcome"] == "fault" and "CUDA_ERROR_ILLEGAL_ADDRESS" in got["detail"], got
    assert _verify(c)["outcome"] == "pass"


def test_a_store_into_the_guard_zone_is_a_fault_naming_o(cuda_backend):
    got = _verify(FAULT_CASE, "oob_store_small")
    assert got["outcome"] == "fault" and "store outside o" in got["detail"], got


def test_outputs_and_inputs_carry_guard_zones_that_the_correct_kernels_leave_alone(cuda_backend):
    from kernels.guards import GUARD_BYTES

    assert cuda_backend.guard_bytes == GUARD_BYTES
    for c in random_configs(30, seed=9):
        _run(cuda_backend, c)   # a changed canary would raise DeviceFault


def test_outputs_are_nan_prefilled(cuda_backend, monkeypatch):
    c = cfg(dtype="bf16", split_kv=4, return_lse=True)
    monkeypatch.setattr(type(cuda_backend), "_rt_launch", lambda self, f, launch: None)
    _, _, res = _run(cuda_backend, c)
    assert np.isnan(res.out.astype(np.float32)).all() and np.isnan(res.lse).all()
    assert np.isnan(res.o_partials).all() and np.isnan(res.lse_partials).all()
    monkeypatch.undo()
    _, _, res = _run(cuda_backend, c)
    assert not np.isnan(res.out.astype(np.float32)).any()


@pytest.mark.parametrize("split", [1, 2, 7, 128])
def test_partial_buffers_equal_splitkv_extra_bytes(cuda_backend, split):
    c = cfg(dtype="f16", g=2, num_heads_q=4, num_heads_kv=2, seq_len_q=3, head_dim_v=40,
            split_kv=split, return_lse=split > 1)
    _run(cuda_backend, c)
    alloc = cuda_backend.last_alloc
    assert alloc.get("o_part", 0) + alloc.get("lse_part", 0) == splitkv_extra_bytes(c)
    assert ("o_part" in alloc) == (split > 1)


def test_cache_hit_on_second_prepare(cuda_backend):
    c = cfg(dtype="f32", head_dim_qk=48)
    cuda_backend._loaded.clear()
    first = cuda_backend.prepare(c)
    cuda_backend._loaded.clear()
    second = cuda_backend.prepare(c)
    assert second.cache_hit and second.variant == first.variant
