"""Exact reference vs torch's float64 CPU scaled_dot_product_attention, shape by shape.

    .venv/bin/python -m bench.reference [--repeat 3]     (or: .venv/bin/python bench/reference.py)

Both start from the same stored inputs (make_inputs): torch's time includes turning them into
float64 tensors and building its mask, as the reference has to do the same work; the
SDPA call alone is shown too. Times are the best of --repeat interleaved runs. Peak memory is
measured in a fresh process per shape and side: the rise of its peak RSS over one run
(Linux /proc/self/clear_refs), inputs excluded, with glibc told to return large blocks to the
OS at once (MALLOC_MMAP_THRESHOLD_) so that the peak is the run's own. That setting slows
BLAS-heavy code, so the timings run in this process with the default allocator.
Target: ours <= 1.5x torch on every shape.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a file, this module's folder comes first on sys.path and its name shadows the
    # `reference` package it measures: put the repository root there instead.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [str(_here.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _here]

import numpy as np
import torch

from reference import attention_exact, make_inputs
from reference.inputs import as_config

SHAPES = {
    "prefill f16 g1 h8 s4096 d64": dict(dtype="f16", g=1, seq_len_q=4096, seq_len_k=4096, num_heads_q=8, num_heads_kv=8, head_dim_qk=64, head_dim_v=64),
    "prefill causal f16 h8 s4096 d64": dict(dtype="f16", g=1, seq_len_q=4096, seq_len_k=4096, num_heads_q=8, num_heads_kv=8, head_dim_qk=64, head_dim_v=64, causal=True),
    "decode gqa4 f16 g16 h32 sk1024 d128": dict(dtype="f16", g=16, seq_len_q=1, seq_len_k=1024, num_heads_q=32, num_heads_kv=8, head_dim_qk=128, head_dim_v=128),
    "kv-cache bf16 g8 h32/8 sk2048 d128": dict(dtype="bf16", g=8, seq_len_q=1, seq_len_k=2048, num_heads_q=32, num_heads_kv=8, head_dim_qk=128, head_dim_v=128, current_seq_len=[5, 2047, 900, 1500, 64, 1999, 300, 1024]),
    "bias f32 h4 s2048 d256": dict(dtype="f32", g=1, seq_len_q=2048, seq_len_k=2048, num_heads_q=4, num_heads_kv=4, head_dim_qk=256, head_dim_v=256, with_attn_bias=True),
    "causal tiny-head f16 s16384 d4": dict(dtype="f16", g=1, seq_len_q=16384, seq_len_k=16384, num_heads_q=1, num_heads_kv=1, head_dim_qk=4, head_dim_v=4, causal=True),
    "big-head bf16 h2 s1024 d1024": dict(dtype="bf16", g=1, seq_len_q=1024, seq_len_k=1024, num_heads_q=2, num_heads_kv=2, head_dim_qk=1024, head_dim_v=1024),
    "many-batch gqa4 f16 g256 s64 d32": dict(dtype="f16", g=256, seq_len_q=64, seq_len_k=64, num_heads_q=4, num_heads_kv=1, head_dim_qk=32, head_dim_v=32),
    "prefix-causal gqa4 f16 g4 sq512 sk4096": dict(dtype="f16", g=4, seq_len_q=512, seq_len_k=4096, num_heads_q=8, num_heads_kv=2, head_dim_qk=128, head_dim_v=128, causal=True, prefix_offset=[3584, 0, 1000, 3000]),
    "no-scale gqa8 f32 g2 h64/8 s512 d80": dict(dtype="f32", g=2, seq_len_q=512, seq_len_k=512, num_heads_q=64, num_heads_kv=8, head_dim_qk=80, head_dim_v=80, with_attn_scale=False),
}


def torch_inputs(c, inputs):
    """Stored inputs -> float64 tensors, mask and scale for torch's SDPA."""
    def t64(x):
        return torch.from_numpy(np.asarray(x, dtype=np.float64) if x.dtype != np.float64 else x)
    q, k, v = (t64(inputs[name]) for name in ("q", "k", "v"))
    mask, is_causal = None, False
    plain_causal = c.causal and c.prefix_offset is None and c.current_seq_len is None
    if c.current_seq_len is not None or (c.causal and not plain_causal):
        keys = torch.arange(c.seq_len_k)[None, :]
        rows = torch.arange(c.seq_len_q)[:, None]
        mask = torch.ones(c.g, 1, c.seq_len_q, c.seq_len_k, dtype=torch.bool)
        for b in range(c.g):
            if c.current_seq_len is not None:
                mask[b, 0] &= keys <= c.current_seq_len[b]
            if c.causal:
                mask[b, 0] &= keys <= rows + (c.prefix_offset[b] if c.prefix_offset else 0)
    elif plain_causal:
        is_causal = True
    if c.with_attn_bias:
        bias = t64(inputs["bias"])
        mask = bias if mask is None else bias.masked_fill(~mask, -float("inf"))
        if is_causal:
            raise ValueError("bench: causal with bias is not in the shape list")
    scale = 1 / c.head_dim_qk ** 0.5 if c.with_attn_scale else 1.0
    return q, k, v, mask, is_causal, scale


def run_torch(c, inputs, timings):
    t0 = time.perf_counter()
    q, k, v, mask, is_causal, scale = torch_inputs(c, inputs)
    t1 = time.perf_counter()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                           scale=scale, enable_gqa=True)
    timings.append((time.perf_counter() - t0, time.perf_counter() - t1))
    return out


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def peak_rise(fn):
    """Bytes the peak RSS rises above the current RSS while fn runs (None if unsupported)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _status("VmRSS:")
    fn()
    return _status("VmHWM:") - before


def measure_memory(name: str, side: str) -> None:
    """Child process: print the peak RSS rise of one run of `side` on shape `name`."""
    c = as_config(SHAPES[name])
    inputs = make_inputs(c)
    fn = (lambda: attention_exact(c, inputs)) if side == "ours" else (lambda: run_torch(c, inputs, []))
    print(peak_rise(fn))


def memory_in_child(name: str, side: str) -> int | None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory", name, side],
                          env=env, capture_output=True, text=True, check=True)
    value = done.stdout.strip().splitlines()[-1]
    return None if value == "None" else int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory", nargs=2, metavar=("SHAPE", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory:
        measure_memory(*args.memory)
        return
    blas_threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; numpy {np.__version__}, "
          f"OPENBLAS_NUM_THREADS={blas_threads}; load average {os.getloadavg()[0]:.2f}")
    header = f"{'shape':40s} {'ours s':>8s} {'torch s':>8s} {'(sdpa)':>8s} {'ratio':>6s} {'ours MiB':>9s} {'torch MiB':>9s} {'max|diff|':>9s}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name, fields in SHAPES.items():
        c = as_config(fields)
        inputs = make_inputs(c)
        ours, theirs = [], []
        for _ in range(args.repeat):  # interleaved, so background load hits both alike
            t0 = time.perf_counter()
            out, _ = attention_exact(c, inputs)
            ours.append(time.perf_counter() - t0)
            ref = run_torch(c, inputs, theirs)
        diff = float(np.abs(out - ref.numpy()).max())
        del out, ref
        ours_mem, torch_mem = memory_in_child(name, "ours"), memory_in_child(name, "torch")
        t_ours = min(ours)
        t_torch = min(t for t, _ in theirs)
        t_sdpa = min(s for _, s in theirs)
        ratio = t_ours / t_torch
        worst = max(worst, ratio)
        # Other processes on a small host move both columns; the load shows how much.
        mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f}"
        print(f"{name:40s} {t_ours:8.3f} {t_torch:8.3f} {t_sdpa:8.3f} {ratio:6.2f} {mib(ours_mem):>9s} {mib(torch_mem):>9s} {diff:9.1e}")
    print(f"worst ratio {worst:.2f} (target <= 1.5); load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
